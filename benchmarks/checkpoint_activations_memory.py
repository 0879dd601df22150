#!/usr/bin/env python
"""Peak training memory with and without ``--checkpoint-activations`` (fairseq's activation
checkpointing of every layer), by default for the 6-layer 8-path multi-path preset
(``multipath_transformer_6l_8p``, d = 512): Lin et al. 2022 name memory as what limits the
number of paths.

Each setting runs in a fresh process (so one's freed memory cannot hide the other's peak): build
the model, one warm-up step (allocates gradients and Adam's state), then ``--steps`` training
steps (forward, cross-entropy, backward, Adam) on the same batch. Memory is resident memory
(Linux ``/proc/self/status``): ``peak_mib`` the process's peak over the measured steps (model,
gradients, Adam state and activations), ``activation_mib`` that peak minus the resident memory
before them (what the forward keeps for the backward, plus transients). Prints one line per
setting; the last line is one JSON object with ``ratio`` = activation memory with checkpointing /
without (lower is better), ``peak_ratio`` and the step-time ratio (checkpointing recomputes each
layer's forward).

    python benchmarks/checkpoint_activations_memory.py [--arch multipath_transformer_6l_8p]
        [--batch-size 32] [--src-len 32] [--tgt-len 32] [--steps 1]
"""
import argparse
import json
import subprocess
import sys
import time

import torch

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.model_builder import build_model


def status_mib(key: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident since the last reset) in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def reset_peak():
    """Reset ``VmHWM`` to the current resident set (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def run_setting(args, checkpoint: bool) -> dict:
    """Train ``--steps`` steps in this process; returns its memory and time figures."""
    torch.manual_seed(0)
    flags = ["--checkpoint-activations"] if checkpoint else []
    model = build_model(args.arch, flags + ["--dropout", "0.1"], vocab_size=args.vocab).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, args.vocab, (args.batch_size, args.src_len), generator=g)
    prev = torch.randint(4, args.vocab, (args.batch_size, args.tgt_len), generator=g)
    target = torch.randint(4, args.vocab, (args.batch_size, args.tgt_len), generator=g)

    def step():
        optimizer.zero_grad(set_to_none=False)  # gradients stay allocated: not counted as activations
        logits, _ = model(src, torch.full((args.batch_size,), args.src_len), prev)
        torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1)).backward()
        optimizer.step()

    step()  # warm-up
    before = status_mib("VmRSS")
    reset_peak()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = (time.perf_counter() - start) / args.steps
    peak = status_mib("VmHWM")
    return {"checkpoint_activations": checkpoint, "peak_mib": round(peak), "activation_mib": round(peak - before),
            "seconds_per_step": round(seconds, 2), "params": sum(p.numel() for p in model.parameters())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="multipath_transformer_6l_8p")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--tgt-len", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--setting", choices=["plain", "checkpoint"], help=argparse.SUPPRESS)  # one child run
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.setting:
        print(json.dumps(run_setting(args, args.setting == "checkpoint")))
        return
    results = {}
    for setting in ("plain", "checkpoint"):
        out = subprocess.run([sys.executable, __file__, *argv, "--setting", setting], check=True,
                             capture_output=True, text=True).stdout
        results[setting] = json.loads(out.strip().splitlines()[-1])
        print(f"{args.arch} {setting:10s} peak {results[setting]['peak_mib']} MiB, activations "
              f"{results[setting]['activation_mib']} MiB, {results[setting]['seconds_per_step']} s/step")
    plain, ckpt = results["plain"], results["checkpoint"]
    print(json.dumps({"benchmark": "checkpoint_activations_memory", "arch": args.arch,
                      "tokens_per_batch": args.batch_size * (args.src_len + args.tgt_len), "plain": plain,
                      "checkpoint": ckpt, "ratio": round(ckpt["activation_mib"] / plain["activation_mib"], 3),
                      "peak_ratio": round(ckpt["peak_mib"] / plain["peak_mib"], 3),
                      "time_ratio": round(ckpt["seconds_per_step"] / plain["seconds_per_step"], 3)}))


if __name__ == "__main__":
    main()
