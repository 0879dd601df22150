#!/usr/bin/env python
"""How often ``--moe-compile`` compiles: WideNet trained over real batches of one epoch (fairseq's
varying batch shapes, forward and backward through the task's ``train_step``), counting the graphs
``torch._dynamo`` captured and the recompilations its guards asked for. Shapes are marked dynamic,
so a new batch shape should reuse a graph; the count depends on dynamo's guards, not on the
backend, so ``aot_eager`` (graph capture without code generation) measures it in minutes on a CPU.

    python benchmarks/moe_recompiles.py --data DATA_BIN [--arch widenet_multi30k] [--batches 0 (= the epoch)]
        [--backend aot_eager]

The last line is one JSON object: batches, distinct batch shapes, unique graphs, recompilations,
graph breaks.
"""
import argparse
import json

import torch
import torch._dynamo.utils as dynamo_utils

from fairseq_widearch.experiments.compare import training_setup, train_steps
from fairseq_widearch.modules import moe


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--arch", default="widenet_multi30k")
    p.add_argument("--batches", type=int, default=0, help="training batches (0: the whole epoch)")
    p.add_argument("--backend", default="aot_eager", help="torch.compile backend")
    args = p.parse_args(argv)
    moe.COMPILE_BACKEND = args.backend
    setup = training_setup(["--arch", args.arch, "--moe-compile", "--moe-balance-weight", "0.01"], args.data,
                           args.batches or 10 ** 9)
    samples = setup[3]
    dynamo_utils.counters.clear()
    train_steps(setup)
    stats = dynamo_utils.counters["stats"]
    shapes = {tuple(s["net_input"]["src_tokens"].shape) + tuple(s["net_input"]["prev_output_tokens"].shape)
              for s in samples}
    print(json.dumps({"benchmark": "moe_recompiles", "arch": args.arch, "backend": args.backend,
                      "batches": len(samples), "batch_shapes": len(shapes),
                      "unique_graphs": stats["unique_graphs"],
                      "recompilations": sum(dynamo_utils.counters["recompiles"].values()),
                      "graph_breaks": sum(dynamo_utils.counters["graph_break"].values()),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
