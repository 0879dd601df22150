#!/usr/bin/env python
"""The cost table: each architecture's Multi30k preset and one paper-size preset beside the stock
Transformer of equal training FLOPs (docs/benchmarks.md, "Cost per FLOP").

On a GPU each operator that computes (not a view) is at least one kernel launch, and every one costs
its Python and dispatch time on the host; once the host waits for the device (a value or a data-dependent shape read back), the
device's queue runs dry and every launch after it is paid with the device idle. So a design that
needs more operators per FLOP than the Transformer, or waits where it does not, loses utilisation
at small batches whatever its FLOPs. Counted here on the CPU with a ``TorchDispatchMode``
(``fairseq_widearch.experiments.counting.OperatorCounter``), clock-free:

* a training step: forward, cross-entropy with the auxiliary losses, backward;
* a decoding step: one beam-search step of the model (``reorder_incremental_state``, the decoder on
  the last token with its incremental state, log-probabilities), at the fourth target position;
* WideNet's MoE layer alone beside the dense FFN (``moe_layer``).

Waits are the operators that read a result on the host (``HOST_WAIT_OPERATORS``) and boolean
indexing; atomic adds the scatter-adds. ``excess`` names the operators of which the system runs the
most more than its twin. The counts do not depend on the batch size; FLOPs do, so the twin (its
encoder depth) is matched on the same batch. With ``--timing``, each system and its twin also train
alternately in one process (``training_utilisation.compare``, fp32): ``throughput_per_flop`` =
(the system's training FLOPs per second) / (its twin's), the CPU's clock on both alike, and
``slower`` names the operators whose CPU time in one profiled step most exceeds the twin's.

Systems (``--systems``): ``arch`` or ``arch:flag=value,...`` for a candidate. The last line is one
JSON object (``docs/data/cost_table.json`` is the committed one).

    python benchmarks/operator_counts.py --timing
"""
import argparse
import json
from collections import Counter

import torch
import torch.nn.functional as F

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.experiments.counting import OperatorCounter
from fairseq_widearch.experiments.data import random_training_batches
from fairseq_widearch.experiments.settings import paper_presets
from fairseq_widearch.model_builder import build_model
from fairseq_widearch.modules import Experts, MoELayer, TopKRouter
from on_device import training_loss
from training_utilisation import compare, parse_system, step_flops, stock_flags, twin_layers

#: Each architecture's Multi30k preset and a paper-size one.
SYSTEMS = tuple(preset for arch, paper in paper_presets().items() for preset in (f"{arch}_multi30k", paper))
#: The targets: operators per step at most this times the twin's, host waits at most the twin's;
#: CPU training throughput per FLOP at least this times the twin's.
OPERATORS, THROUGHPUT = 1.10, 0.95
#: The MoE layer's operators per call (``moe_layer``), at most.
MOE = 100

def counts(counter: OperatorCounter) -> dict:
    return {"operators": counter.operators, "host_waits": counter.host_waits, "atomic_adds": counter.atomic_adds,
            "by_name": dict(counter.counts)}


def training_step(model, batch) -> dict:
    model.train().zero_grad(set_to_none=True)
    with OperatorCounter() as counter:
        training_loss(model, batch).backward()
    model.zero_grad(set_to_none=True)
    return counts(counter)


@torch.no_grad()
def decoding_step(model, batch, step: int = 3) -> dict:
    """One beam-search step of ``model`` at target position ``step`` (after ``step`` uncounted ones)."""
    src, lengths, prev, _ = batch
    model.eval()
    encoder_out = model.encoder(src, src_lengths=lengths)
    state, order = {}, torch.arange(src.shape[0])

    def one(t):
        model.decoder.reorder_incremental_state_scripting(state, order)
        out = model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)
        model.get_normalized_probs(out, log_probs=True)

    for t in range(step):
        one(t)
    with OperatorCounter() as counter:
        one(step)
    return counts(counter)


def moe_layer() -> dict:
    """One forward + backward of WideNet's MoE layer (d 128, FFN 512, E 4, top-2, C 1.2, 1,024 tokens
    with a padding mask, training mode, the balance loss) as every call after the first runs it (the
    first builds the router's tables), beside the dense FFN's on the same tokens."""
    torch.manual_seed(0)
    moe = MoELayer(TopKRouter(128, 4, 2, 1.2), Experts(4, 128, 512)).train()
    x = torch.randn(1024, 1, 128, requires_grad=True)
    no_padding = torch.zeros(1, 1024, dtype=torch.bool)
    fc1, fc2 = torch.nn.Linear(128, 512), torch.nn.Linear(512, 128)

    def call():
        y, routing = moe(x, no_padding)
        (y + routing.balance_loss).sum().backward()

    call()
    moe.zero_grad(set_to_none=True)
    x.grad = None
    with OperatorCounter() as layer:
        call()
    x.grad = None
    with OperatorCounter() as dense:
        fc2(F.relu(fc1(x))).sum().backward()
    return {**{k: v for k, v in counts(layer).items() if k != "by_name"}, "dense_ffn_operators": dense.operators}


def excess(mine: dict, twin: dict, n: int = 6) -> list:
    """The ``n`` operators the system runs most more often than its twin: [[name, difference], ...]."""
    diff = Counter(mine["by_name"])
    diff.subtract(twin["by_name"])
    return [[name.removeprefix("aten."), d] for name, d in diff.most_common(n) if d > 0]


def self_times(model, batch) -> Counter:
    """Milliseconds of CPU time of each ATen operator in one training step (``torch.profiler``), after
    an unprofiled one."""
    for profiled in (False, True):
        with torch.autograd.profiler.profile(enabled=profiled) as prof:
            training_loss(model.train(), batch).backward()
        model.zero_grad(set_to_none=True)
    return Counter({e.key.removeprefix("aten::"): e.self_cpu_time_total / 1e3 for e in prof.key_averages()
                    if e.key.startswith("aten::")})


def slower(mine: Counter, twin: Counter, n: int = 3) -> list:
    """The ``n`` operators whose time exceeds the twin's the most: [[name, milliseconds more], ...]."""
    mine.subtract(twin)
    return [[name, round(ms, 1)] for name, ms in mine.most_common(n) if ms > 0]


def row(system: str, batch, args) -> dict:
    """``system``'s and its FLOP-matched twin's counts, per training and per decoding step."""
    arch, flags = parse_system(system)
    model = build_model(arch, flags, vocab_size=args.vocab).train()
    flops = step_flops(model, batch)
    layers = twin_layers(system, flops, batch, args)
    twin = build_model("transformer", stock_flags(system, layers), vocab_size=args.vocab).train()
    result = {"gflops": round(flops / 1e9, 3), "twin_encoder_layers": layers,
              "twin_gflops": round(step_flops(twin, batch) / 1e9, 3)}
    for name, count in (("train", training_step), ("decode", decoding_step)):
        mine, stock = count(model, batch), count(twin, batch)
        result[name] = {**{k: v for k, v in mine.items() if k != "by_name"},
                        "twin": {k: v for k, v in stock.items() if k != "by_name"},
                        "ratio": round(mine["operators"] / stock["operators"], 3),
                        "excess": excess(mine, stock)}
    if args.timing:
        result["slower"] = slower(self_times(model, batch), self_times(twin, batch))
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=";".join(SYSTEMS), help="semicolon-separated systems")
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=30)
    p.add_argument("--timing", action="store_true", help="also CPU training throughput per FLOP against the twin")
    p.add_argument("--steps", type=int, default=3, help="with --timing: updates per model per round")
    p.add_argument("--rounds", type=int, default=4, help="with --timing: alternating rounds")
    args = p.parse_args(argv)
    args.device, args.dtype = "cpu", "fp32"
    torch.manual_seed(0)
    batches = random_training_batches(args.steps, args.batch_size, args.src_len, args.tgt_len, args.vocab)
    results = {}
    for system in args.systems.split(";"):
        results[system] = res = row(system, batches[0], args)
        if args.timing:
            res["throughput_per_flop"] = compare(system, batches, 1.0, args)["ratio"]
        train, decode = res["train"], res["decode"]
        print(f"{system:>40}: training {train['operators']:5d} ops / twin's {train['twin']['operators']:5d} "
              f"({res['twin_encoder_layers']} encoder layers) = {train['ratio']:.3f}, waits {train['host_waits']} / "
              f"{train['twin']['host_waits']}, atomic adds {train['atomic_adds']} | decoding {decode['ratio']:.3f}, waits "
              f"{decode['host_waits']} / {decode['twin']['host_waits']}"
              + (f" | throughput per FLOP {res['throughput_per_flop']:.3f}" if args.timing else ""), flush=True)
    moe = moe_layer()
    print(f"{'MoE layer':>40}: {moe['operators']} operators, {moe['host_waits']} waits, {moe['atomic_adds']} atomic adds "
          f"| dense FFN {moe['dense_ffn_operators']}")
    print(json.dumps({"batch_size": args.batch_size, "src_len": args.src_len, "tgt_len": args.tgt_len,
                      "vocab": args.vocab, "threads": torch.get_num_threads(), "targets": {
                          "operators": OPERATORS, "throughput_per_flop": THROUGHPUT, "moe_layer_operators": MOE},
                      "moe_layer": moe, **results}))


if __name__ == "__main__":
    main()
