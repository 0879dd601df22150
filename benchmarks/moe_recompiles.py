#!/usr/bin/env python
"""How often ``--moe-compile`` compiles: WideNet over real batches of one epoch, in the four ways a
user runs it, counting the graphs ``torch._dynamo`` captured: training (fairseq's varying batch shapes, forward and backward through the task's
``train_step``), a validation pass (the task's ``valid_step`` over the same batches, eval mode),
batches without padding (each batch's sentences cut to its shortest source and target), and
incremental decoding (the encoder once, then the decoder one target position at a time, 5
hypotheses per sentence as beam search runs it). Shapes are marked dynamic, so a new batch shape
should reuse a graph. A recompilation (a guard that failed) captures a new graph, so the graphs
a phase captures after its first batch (its warm-up) count its recompilations: dynamo's own
``counters["recompiles"]`` is never incremented in torch 2.13. The counts depend on dynamo's guards,
not on the backend, so ``aot_eager`` (graph capture without code generation) measures them in
minutes on a CPU.

    python benchmarks/moe_recompiles.py --data DATA_BIN [--arch widenet_multi30k] [--batches 0 (= the epoch)]
        [--backend aot_eager]

The last line is one JSON object: batches, distinct batch shapes, and per phase (in the order
above) the unique graphs captured from its start, those captured after its first batch
(``graphs_after_warmup``: its recompilations) and the graph breaks.
"""
import argparse
import json

import torch
import torch._dynamo.utils as dynamo_utils

from fairseq_widearch.experiments.compare import training_setup, train_steps
from fairseq_widearch.modules import moe

BEAM = 5


def counts() -> dict:
    return {"unique_graphs": dynamo_utils.counters["stats"]["unique_graphs"],
            "graph_breaks": sum(dynamo_utils.counters["graph_break"].values())}


def phase(run, batches) -> dict:
    """``run(batch)`` over ``batches``: the counts from the phase's start and after its first batch."""
    dynamo_utils.counters.clear()
    run(batches[0])
    warm = counts()
    for batch in batches[1:]:
        run(batch)
    done = counts()
    return {**done, "graphs_after_warmup": done["unique_graphs"] - warm["unique_graphs"]}


def unpadded(sample, pad: int) -> dict:
    """The sample's sentences cut to its shortest source (left-padded: its last columns) and its
    shortest target, so that no position is padding."""
    src, prev = sample["net_input"]["src_tokens"], sample["net_input"]["prev_output_tokens"]
    src_len, tgt_len = int(src.ne(pad).sum(1).min()), int(prev.ne(pad).sum(1).min())
    net_input = {"src_tokens": src[:, -src_len:].contiguous(), "src_lengths": torch.full((src.shape[0],), src_len),
                 "prev_output_tokens": prev[:, :tgt_len].contiguous()}
    return {**sample, "net_input": net_input, "target": sample["target"][:, :tgt_len].contiguous()}


def decode_incrementally(model, sample, steps: int = 8):
    """Beam search's calls: the encoder over the batch repeated ``BEAM`` times, then the decoder
    position by position with its incremental state (one target token per hypothesis and step)."""
    src = sample["net_input"]["src_tokens"].repeat_interleave(BEAM, 0)
    lengths = sample["net_input"]["src_lengths"].repeat_interleave(BEAM, 0)
    encoder_out, state = model.encoder(src, lengths), {}
    prev = sample["net_input"]["prev_output_tokens"].repeat_interleave(BEAM, 0)
    for t in range(1, min(steps, prev.shape[1]) + 1):
        model.decoder(prev[:, :t], encoder_out=encoder_out, incremental_state=state)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--arch", default="widenet_multi30k")
    p.add_argument("--batches", type=int, default=0, help="batches (0: the whole epoch)")
    p.add_argument("--backend", default="aot_eager", help="torch.compile backend")
    args = p.parse_args(argv)
    moe.COMPILE_BACKEND = args.backend
    setup = training_setup(["--arch", args.arch, "--moe-compile", "--moe-balance-weight", "0.01"], args.data,
                           args.batches or 10 ** 9)
    model, criterion, task, samples = setup
    pad = task.target_dictionary.pad()
    phases = {"training": phase(lambda s: train_steps((model, criterion, task, [s])), samples)}
    model.eval()
    with torch.no_grad():
        phases["validation"] = phase(lambda s: task.valid_step(s, model, criterion), samples)
        phases["unpadded"] = phase(lambda s: task.valid_step(s, model, criterion), [unpadded(s, pad) for s in samples])
        phases["incremental decoding"] = phase(lambda s: decode_incrementally(model, s), samples)
    shapes = {tuple(s["net_input"]["src_tokens"].shape) + tuple(s["net_input"]["prev_output_tokens"].shape)
              for s in samples}
    print(json.dumps({"benchmark": "moe_recompiles", "arch": args.arch, "backend": args.backend,
                      "batches": len(samples), "batch_shapes": len(shapes), "phases": phases,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
