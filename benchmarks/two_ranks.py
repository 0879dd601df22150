#!/usr/bin/env python
"""Data parallelism in half precision through fairseq's own trainer: two ranks against one rank
with ``--update-freq 2`` over the same batches (docs/gpu.md, "The GPU check"; its runs in docs/records/gpu_runs.md).

For each ``_tiny`` preset (the scalable one under its task, stage 2), ``--updates`` updates of
fairseq's distributed trainer with 2 gloo ranks on one device (``--device cuda``: both on GPU 0;
``cpu``: ``--cpu``), in ``--precision`` (fairseq's FP16Optimizer: fp32 master weights, gradients
all-reduced in half precision) with ``--ddp-backend``, then the same with one rank and
``--update-freq 2``. fairseq gives rank r the batches r, r + 2, ... of the same epoch order, so each
update sees the same two batches either way. Dropout is off; the latent layers' samples and the
router noise stay (each rank draws its own, so the curves may differ by that much). In fp16 the one
rank starts at half the loss scale: DDP averages the ranks' scaled half-precision gradients, which
fairseq multiplies back by the world size only in fp32, so two ranks at scale S hold the same fp16
gradients as one rank accumulating two batches at S / 2, and overflow (a skipped update) where it
does; at equal scales the one rank's gradients are twice as large and overflow sooner (the scalable
preset on the H200, 2026-11-27: a skipped second update, 8 % apart by update 14). Each run's skipped
updates are counted (``overflows``).

Checked per preset: the ranks end with identical parameters (``ranks_identical``); the loss of every
update agrees with the one rank's within ``--tolerance`` (relative; ``max_relative_loss_difference``);
the parameters' largest difference to the one rank's is reported. The last line is one JSON object;
the exit status is 1 if a check fails.

    python benchmarks/two_ranks.py --data .gpu/multi30k/bin --device cuda --precision fp16
    python benchmarks/two_ranks.py --data DATA --device cpu --precision bf16 --archs widenet_tiny --updates 4
"""
import argparse
import json
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

import fairseq_widearch  # noqa: F401  (registers the plugin; its checkpoints load with weights_only)
from fairseq_widearch.experiments.runner import train_inner
from fairseq_widearch.experiments.settings import criterion_flags, tiny_cases

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "helpers" / "ddp_worker.py"  # fairseq-train, every rank saving its checkpoint
PRECISIONS = {"fp32": [], "fp16": ["--fp16"], "memory_efficient_fp16": ["--memory-efficient-fp16"], "bf16": ["--bf16"],
              "memory_efficient_bf16": ["--memory-efficient-bf16"]}
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Per preset, what keeps the per-rank noise below the check's resolution: latent depth under Eq. 8
#: (relaxed samples throughout, no ramps). Its default draws straight-through 0/1 samples from
#: update 1, each rank its own, which moved the loss by 1.3 % at update 4 against one rank's (the
#: ranks' parameters identical), and its ramps raise the total loss over the first updates.
NOISE = {"latent_depth_transformer_tiny": ["--latent-objective", "ours"]}


def train_flags(args, arch: str, save: Path) -> list:
    flags = [args.data, "--arch", arch, *tiny_cases()[arch], *NOISE.get(arch, []), "--user-dir", REPO / "fairseq_widearch",
             "--save-dir", save,
             "--max-update", args.updates, "--num-workers", "0", "--optimizer", "adam", "--lr", "0.001",
             "--max-tokens", args.max_tokens, "--seed", "1", "--disable-validation", "--no-epoch-checkpoints",
             "--log-format", "json", "--log-interval", "1", *NO_DROPOUT, *PRECISIONS[args.precision],
             "--ddp-backend", args.ddp_backend, *(["--cpu"] if args.device == "cpu" else ["--device-id", "0"])]
    return [str(f) for f in flags + criterion_flags(flags)]


#: The one rank's initial loss scale per precision: half of fairseq's default 128 (module docstring).
HALF_SCALE = {"fp16": ["--fp16-init-scale", "64"], "memory_efficient_fp16": ["--fp16-init-scale", "64"]}


def overflows(log: str) -> int:
    """Updates fairseq skipped for a half-precision gradient overflow."""
    return log.count("gradient overflow detected")


def losses(log: str) -> list:
    """Loss of every update, from fairseq's json train_inner records."""
    return [record["loss"] for record in train_inner(log)]


def launch(cmd):
    proc = subprocess.run([sys.executable, WORKER, *cmd], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout + proc.stderr


def params(save: Path) -> dict:
    return torch.load(save / "checkpoint_last.pt", map_location="cpu")["model"]


def compare(args, arch: str, work: Path) -> dict:
    """Two ranks and one rank with --update-freq 2 of ``arch``; -> the figures and checks."""
    port = free_port()
    ranks = [train_flags(args, arch, work / f"rank{r}") + [
        "--distributed-backend", "gloo", "--distributed-world-size", "2", "--distributed-no-spawn",
        "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-rank", str(r)] for r in range(2)]
    for r in range(2):
        (work / f"rank{r}").mkdir(parents=True)  # fairseq makes the save dir on the master only
    with ThreadPoolExecutor(3) as pool:
        logs = list(pool.map(launch, [*ranks, train_flags(args, arch, work / "one") + [
            "--update-freq", "2", *HALF_SCALE.get(args.precision, [])]]))
    two, one = losses(logs[0]), losses(logs[2])
    states = [params(work / name) for name in ("rank0", "rank1", "one")]
    identical = all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    relative = max((abs(a - b) / max(abs(b), 1e-6) for a, b in zip(two, one)), default=float("inf"))
    param_difference = max((states[0][k].float() - states[2][k].float()).abs().max().item()
                           for k in states[0] if states[0][k].is_floating_point())
    return {"updates": len(two), "loss_two_ranks": two, "loss_one_rank_update_freq_2": one,
            "ranks_identical": identical, "max_relative_loss_difference": round(relative, 6),
            "max_abs_parameter_difference": param_difference,
            "overflows": {"two_ranks": overflows(logs[0]), "one_rank": overflows(logs[2])},
            "ok": identical and len(two) == len(one) == args.updates and relative <= args.tolerance}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="fairseq data directory (the quick start's bin/)")
    p.add_argument("--archs", default=",".join(tiny_cases()), help="comma-separated _tiny presets")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="bf16")
    p.add_argument("--ddp-backend", choices=("pytorch_ddp", "legacy_ddp"), default="pytorch_ddp")
    p.add_argument("--updates", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--tolerance", type=float, default=0.02, help="largest relative loss difference per update")
    p.add_argument("--work-dir", help="where the checkpoints go (default: a temporary directory)")
    args = p.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work_dir or tmp)
        with ThreadPoolExecutor(len(args.archs.split(","))) as pool:
            futures = {arch: pool.submit(compare, args, arch, work / arch) for arch in args.archs.split(",")}
        for arch, future in futures.items():
            try:
                results[arch] = future.result()
            except RuntimeError as error:
                results[arch] = {"ok": False, "error": str(error)}
            res = results[arch]
            print(f"{arch}: {'ok' if res['ok'] else 'FAILED'} "
                  + (f"ranks identical {res['ranks_identical']}, loss vs one rank x update-freq 2: "
                     f"{res['max_relative_loss_difference']} (tolerance {args.tolerance})" if "error" not in res
                     else res["error"][-800:]))
    print(json.dumps({"device": args.device, "precision": args.precision, "ddp_backend": args.ddp_backend,
                      "updates": args.updates, "tolerance": args.tolerance, "results": results}))
    sys.exit(0 if all(r["ok"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
