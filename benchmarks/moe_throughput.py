#!/usr/bin/env python
"""MoE layer cost against its ideal: forward + backward of the MoE layer (E = 4, K = 2, C = 1.2,
training mode, router noise on) versus K·C times a dense FFN of the same d_ffn.

With capacity factor C, the E experts process up to K·C·N token slots for N tokens, so K·C dense
FFNs over the N tokens are the ideal cost; routing, dispatch and combine are the overhead. Both
run in one process, alternating, on the same input. The last line is one JSON object with the
figures and ``ratio`` = MoE time / (K·C × dense time); target <= 1.15 (>= 85% of the ideal).
The layer gets a padding mask, as in a model (all False: a batch without padding, so that the
ideal stays K·C dense FFNs).
It runs twice, in fresh processes (``malloc_modes.py``): with glibc's default malloc
(``ratio_default_malloc``) and with freed memory reused (``ratio``); the MoE layer's expert
buffers (E x B x d_ffn, 40 MB here) exceed glibc's 32 MB mmap ceiling, the dense FFN's do not.

On a GPU (``--device cuda``: one run in this process, the malloc settings concern host memory),
at WideNet's size and precision: ``--device cuda --dtype fp16 --tokens 8192 --dim 768 --ffn 3072``.

    python benchmarks/moe_throughput.py [--tokens 4096] [--dim 256] [--ffn 1024] [--device cpu|cuda]
        [--dtype fp32|fp16|bf16]
"""
import argparse
import json
import sys
from functools import partial

import torch
import torch.nn.functional as F

from fairseq_widearch.experiments.counting import alternating_rounds
from fairseq_widearch.modules import Experts, MoELayer, TopKRouter
from malloc_modes import both_modes
from on_device import add_arguments, check, clock, describe, to


def fwd_bwd(fn, x, repeats):
    for _ in range(repeats):
        fn(x).float().sum().backward()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096, help="N, tokens per call (T x B)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--capacity-factor", type=float, default=1.2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5, help="calls per model per round")
    add_arguments(p)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    check(p, args)
    if not args.child and args.device == "cpu":
        default, reuse = both_modes(__file__, argv if argv is not None else sys.argv[1:])
        for label, res in (("glibc default malloc", default), ("freed memory reused", reuse)):
            print(f"-- {label}: MoE {res['moe_ms']:.2f} ms, dense FFN {res['dense_ms']:.2f} ms, "
                  f"ideal K*C*dense {res['ideal_ms']:.2f} ms, ratio MoE / ideal = {res['ratio']:.3f} (target <= 1.15)")
        print(json.dumps({**reuse, "ratio_default_malloc": default["ratio"], "default_malloc": default}))
        return
    torch.manual_seed(0)
    router = TopKRouter(args.dim, args.experts, args.top_k, args.capacity_factor)
    experts = Experts(args.experts, args.dim, args.ffn)
    moe = to(MoELayer(router, experts), args).train()
    fc1, fc2 = to(torch.nn.Linear(args.dim, args.ffn), args), to(torch.nn.Linear(args.ffn, args.dim), args)
    x = to(torch.randn(args.tokens, 1, args.dim), args).requires_grad_()
    no_padding = torch.zeros(1, args.tokens, dtype=torch.bool, device=args.device)

    def moe_fn(inp):
        y, routing = moe(inp, no_padding)
        return y + routing.balance_loss

    def dense_fn(inp):
        return fc2(F.relu(fc1(inp)))

    fns = {"moe": moe_fn, "dense": dense_fn}
    for fn in fns.values():  # warm-up
        fwd_bwd(fn, x, 2)
    seconds = alternating_rounds({name: partial(fwd_bwd, fn, x, args.repeats) for name, fn in fns.items()},
                                 args.rounds, lambda: clock(args))
    calls = args.rounds * args.repeats
    ms = {name: 1e3 * s / calls for name, s in seconds.items()}
    ideal_ms = args.top_k * args.capacity_factor * ms["dense"]
    print(json.dumps({"tokens": args.tokens, "dim": args.dim, "ffn": args.ffn, "experts": args.experts,
                      "top_k": args.top_k, "capacity_factor": args.capacity_factor,
                      "threads": torch.get_num_threads(), **describe(args), "moe_ms": round(ms["moe"], 3),
                      "dense_ms": round(ms["dense"], 3), "ideal_ms": round(ideal_ms, 3),
                      "ratio": round(ms["moe"] / ideal_ms, 3), "target": "<= 1.15"}))


if __name__ == "__main__":
    main()
