#!/usr/bin/env python
"""Operators and host waits per training step, on the CPU, of each architecture and candidate
beside the stock Transformer's at equal training FLOPs (docs/benchmarks.md, "Operators per step").

On a GPU each operator is at least one kernel launch and costs its Python and launch time on the
host; once the host waits for the device (a value or a data-dependent shape read back), the
device's queue runs dry and every launch after it is paid with the device idle. So a design that
needs more operators per FLOP than the Transformer, or waits where it does not, loses utilisation
at small batches whatever its FLOPs. Counted here with a ``TorchDispatchMode``
(``fairseq_widearch.experiments.counting.OperatorCounter``) over one training step (forward,
cross-entropy with the auxiliary losses, backward) of the paper-size preset on a small batch (the
counts do not depend on the batch size; FLOPs do, so the twin is matched on the same batch).
Waits are the operators that read a result on the host (``HOST_WAIT_OPERATORS``) and boolean
indexing; atomic adds the scatter-adds.

Systems (``--systems``): ``arch`` or ``arch:flag=value,...`` for a candidate (for example
``widenet_wmt_en_de:--moe-dispatch=permute``); ``--moe-dispatch=grouped`` counts grouped's own code,
as on the GPUs where it runs (on the CPU the layer would run ``padded``). The last line is one JSON
object.

    python benchmarks/operator_counts.py
"""
import argparse
import json

import torch

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.experiments.counting import OperatorCounter
from fairseq_widearch.experiments.data import random_training_batches
from fairseq_widearch.model_builder import build_model
from on_device import grouped_everywhere, training_loss
from training_utilisation import parse_system, step_flops, stock_flags, twin_layers

SYSTEMS = ("multipath_transformer_6l_4p", "widenet_wmt_en_de", "widenet_wmt_en_de:--moe-dispatch=index",
           "widenet_wmt_en_de:--moe-dispatch=permute", "scalable_transformer_wmt_en_de",
           "latent_depth_transformer_lld_12_24", "partialformer_24_6_d360_h30_16",
           "partialformer_24_6_d360_h30_16:--partial-attention-kernel=explicit",
           "partialformer_24_6_d360_h30_16:--partial-attention-kernel=sdpa")


def counted(model, batch) -> dict:
    model.zero_grad(set_to_none=True)
    with OperatorCounter() as counter:
        training_loss(model, batch).backward()
    return {"operators": counter.operators, "host_waits": counter.host_waits, "atomic_adds": counter.atomic_adds,
            "wait_sites": {k: v for k, v in counter.counts.items() if k in ("nonzero", "_local_scalar_dense")
                           or "boolean" in k}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=";".join(SYSTEMS), help="semicolon-separated systems")
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=30)
    args = p.parse_args(argv)
    args.device, args.dtype = "cpu", "fp32"
    torch.manual_seed(0)
    batch = random_training_batches(1, args.batch_size, args.src_len, args.tgt_len, args.vocab)[0]
    results = {}
    # grouped counted as it runs where it runs its own code (bf16 on a Hopper GPU); here it would run padded
    with grouped_everywhere():
        for system in args.systems.split(";"):
            results[system] = counted_system(system, batch, args)
    print(json.dumps({"batch_size": args.batch_size, "src_len": args.src_len, "tgt_len": args.tgt_len,
                      "vocab": args.vocab, **results}))


def counted_system(system: str, batch, args) -> dict:
    """The operator counts of ``system``'s training step and of its FLOP-matched stock twin's; printed."""
    arch, flags = parse_system(system)
    model = build_model(arch, flags, vocab_size=args.vocab).train()
    flops = step_flops(model, batch)
    layers = twin_layers(arch, flops, batch, args)
    twin = build_model("transformer", stock_flags(arch, layers), vocab_size=args.vocab).train()
    twin_flops = step_flops(twin, batch)
    mine, stock = counted(model, batch), counted(twin, batch)
    result = {**mine, "gflops": round(flops / 1e9, 3), "twin_encoder_layers": layers,
              "twin": {**stock, "gflops": round(twin_flops / 1e9, 3)},
              "operators_per_flop_ratio": round(mine["operators"] / flops / (stock["operators"] / twin_flops), 3)}
    print(f"{system:>48}: {mine['operators']:6d} operators, {mine['host_waits']:3d} waits, "
          f"{mine['atomic_adds']:3d} atomic adds | stock twin ({layers}-layer encoder): {stock['operators']:6d} "
          f"operators, {stock['host_waits']:3d} waits | operators per FLOP / twin's "
          f"{result['operators_per_flop_ratio']}", flush=True)
    return result


if __name__ == "__main__":
    main()
