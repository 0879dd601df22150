#!/usr/bin/env python
"""The latent-depth head-to-head on Multi30k one-to-many: fairseq's ``examples/latent_depth`` (the
authors' released code) against ours under its objective and under ours, a fixed number of updates,
several seeds, every run decoded in every mode that applies (``multi30k_o2m.sh``).

    python examples/latent_depth/head_to_head.py run [--seeds 1,2,3] [--systems ...] [--jobs 2]
        [--max-update 2000] [--results docs/data/latent_depth_o2m.jsonl] [--work-dir runs/multi30k_o2m]
        [--data-dir DIR] [--decode MODE,...]
    python examples/latent_depth/head_to_head.py report [--results ...]

``run`` trains and decodes every (system, seed) that has no row in ``--results`` yet, ``--jobs`` at
a time with one thread each (so the runs of a batch are timed side by side), and appends one JSON
row per finished run: updates, training wall time (fairseq's cumulative ``wall``), updates/s, the
runs beside it, the final posterior q(z = 1) of every pair and decoder layer, and sacreBLEU and
the output-length ratio per decoding mode and pair. A run interrupted in training resumes from its
checkpoint. ``report`` prints the table of docs/records/latent_depth_runs.md: mean ± sample
standard deviation over the seeds (and the min-max range) per system and decoding mode.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from fairseq_widearch.experiments.compare import training_updates, training_wall_seconds

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "latent_depth" / "multi30k_o2m.sh"
#: system -> the recipe's flags; every decoding mode that applies to it.
SYSTEMS = {
    "anchor": ["--impl", "anchor", "--decode", "sampled,all"],
    # the anchor with its layer logits initialised to q = 0.5 instead of uninitialised memory
    "anchor_initialised": ["--impl", "anchor_initialised", "--decode", "sampled,all"],
    "ours-objective_released": ["--impl", "ours", "--objective", "released", "--decode", "soft,sampled,hard"],
    "ours-objective_ours": ["--impl", "ours", "--objective", "ours", "--decode", "soft,sampled,hard"],
}
PAIRS = ("de", "fr", "cs")
SCORE_LINE = re.compile(r"^\| (\S+) en-(\w+) (\w+): BLEU = ([\d.]+) .*ratio = ([\d.]+)")


def run_name(system: str, seed: int) -> str:
    """The recipe's name of a run (its checkpoint directory and logs)."""
    return f"{system}-seed{seed}"


def posterior(checkpoint: Path):
    """q(z = 1) ``[[per layer] per pair]`` of the latent decoder in ``checkpoint`` (ours or the anchor's)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]
    key = next(k for k in state if re.search(r"decoder\.layer_select\.(layer_)?logits$", k))
    return [[round(q, 4) for q in row] for row in torch.sigmoid(state[key].float()).tolist()]


def parse(system: str, seed: int, stdout: str, work: Path, max_update: int, beside):
    """One result row from the recipe's output and training log."""
    name = run_name(system, seed)
    log = (work / f"train-{name}.log").read_text()
    updates, wall = training_updates(log), round(training_wall_seconds(log))
    decode = {}
    for line in stdout.splitlines():
        match = SCORE_LINE.match(line)
        if match:
            decode.setdefault(match[3], {})[match[2]] = {"bleu": float(match[4]), "ratio": float(match[5])}
    return {"system": system, "seed": seed, "max_update": max_update, "updates": updates, "train_wall_s": wall,
            "updates_per_s": round(updates / wall, 4), "beside": beside,
            "q_decoder": posterior(work / "checkpoints" / name / "checkpoint_last.pt"), "decode": decode,
            "date": datetime.date.today().isoformat(), "cpu_threads": 1}


def start(system: str, seed: int, args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = ["bash", str(RECIPE), *SYSTEMS[system], "--seed", str(seed), "--max-update", str(args.max_update),
           "--work-dir", str(args.work_dir), *(["--data-dir", str(args.data_dir)] if args.data_dir else []),
           *(["--decode", args.decode] if args.decode else [])]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def done_runs(results: Path):
    if not results.exists():
        return set()
    return {(row["system"], row["seed"]) for row in map(json.loads, results.read_text().splitlines()) if
            row.get("max_update")}


def prepare(args):
    """The recipe's data, made once before runs start side by side (each recipe would otherwise
    write the same files at the same time on a fresh work directory)."""
    subprocess.run([sys.executable, str(ROOT / "examples" / "multi30k" / "prepare.py"), "--work-dir",
                    str(args.work_dir / "data"), *(["--data-dir", str(args.data_dir)] if args.data_dir else []),
                    "--tgt", ",".join(PAIRS)], check=True, capture_output=True)


def run(args):
    todo = [(s, seed) for seed in args.seeds for s in args.systems if (s, seed) not in done_runs(args.results)]
    if todo:
        prepare(args)
    while todo:
        batch, todo = todo[:args.jobs], todo[args.jobs:]
        names = [run_name(s, seed) for s, seed in batch]
        print(f"| {time.strftime('%H:%M')} starting {', '.join(names)}", flush=True)
        procs = [start(s, seed, args) for s, seed in batch]
        for (system, seed), proc in zip(batch, procs):
            stdout, stderr = proc.communicate()
            if proc.returncode:
                sys.exit(f"error: {run_name(system, seed)} failed:\n{stderr[-3000:]}")
            row = parse(system, seed, stdout, args.work_dir, args.max_update,
                        [n for n in names if n != run_name(system, seed)])
            with open(args.results, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"| {time.strftime('%H:%M')} {run_name(system, seed)}: {row['updates']} updates, "
                  f"{json.dumps(row['decode'])}", flush=True)


def mean_spread(values):
    """'mean ± sd (min-max, n)' of ``values``; the sd is omitted for one value."""
    if len(values) == 1:
        return f"{values[0]:.2f} (n = 1)"
    return (f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} "
            f"({min(values):.2f}-{max(values):.2f}, n = {len(values)})")


def mean_bleu(rows, system: str, mode: str):
    """Each run's BLEU averaged over the pairs, for ``system`` decoded in ``mode``, by seed order."""
    runs = sorted((r for r in rows if r["system"] == system and mode in r["decode"]), key=lambda r: r["seed"])
    return [statistics.mean(r["decode"][mode][p]["bleu"] for p in PAIRS) for r in runs]


def gap(a, b) -> str:
    """The mean gap a − b, and whether it exceeds the seeds' spread (|gap| > sd_a + sd_b; needs
    two seeds on each side)."""
    if len(a) < 2 or len(b) < 2:
        return f"{statistics.mean(a) - statistics.mean(b):+.2f}: fewer than two seeds, no verdict"
    delta, spread = statistics.mean(a) - statistics.mean(b), statistics.stdev(a) + statistics.stdev(b)
    return f"{delta:+.2f} (spread {spread:.2f}): {'exceeds' if abs(delta) > spread else 'within'} the spread"


def report(args):
    rows = [json.loads(line) for line in args.results.read_text().splitlines()]
    print("| system | decoding | updates | updates/s | en→de | en→fr | en→cs | mean BLEU | length ratio en→de/fr/cs |")
    print("|---|---|---|---|---|---|---|---|---|")
    modes = {}
    for system in SYSTEMS:
        mine = [r for r in rows if r["system"] == system]
        modes[system] = sorted({m for r in mine for m in r["decode"]})
        for mode in modes[system]:
            runs = [r for r in mine if mode in r["decode"]]
            bleu = {p: [r["decode"][mode][p]["bleu"] for r in runs] for p in PAIRS}
            ratio = "/".join(f"{statistics.mean(r['decode'][mode][p]['ratio'] for r in runs):.2f}" for p in PAIRS)
            print(f"| {system} | {mode} | {statistics.mean(r['updates'] for r in runs):.0f} | "
                  f"{statistics.mean(r['updates_per_s'] for r in runs):.3f} | "
                  + " | ".join(mean_spread(bleu[p]) for p in PAIRS)
                  + f" | **{mean_spread(mean_bleu(rows, system, mode))}** | {ratio} |")
    for reference in ("anchor", "anchor_initialised"):  # the released code, and it with initialised logits
        anchor = mean_bleu(rows, reference, "sampled")
        if not anchor:
            continue
        print(f"\nMean BLEU against {reference} decoded as it trains (sampled):\n")
        for system in [s for s in SYSTEMS if s != reference]:
            for mode in modes[system]:
                print(f"- {system}, {mode}: {gap(mean_bleu(rows, system, mode), anchor)}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["run", "report"])
    parser.add_argument("--seeds", default="1,2,3", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--systems", default=",".join(SYSTEMS), type=lambda s: s.split(","))
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    parser.add_argument("--max-update", type=int, default=2000)
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "data" / "latent_depth_o2m.jsonl")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "multi30k_o2m")
    parser.add_argument("--data-dir", type=Path, help="raw Multi30k (the recipe's default otherwise)")
    parser.add_argument("--decode", help="decoding modes for every system instead of all that apply")
    args = parser.parse_args(argv)
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"--systems: unknown {sorted(unknown)}; known: {list(SYSTEMS)}")
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
