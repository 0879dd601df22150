#!/usr/bin/env python
"""The GPU machine's prepared command (docs/gpu.md, "The GPU check"): in order,
each step under its own time limit so that a stuck step cannot eat the others,

  a. ``tier``: the CUDA test tier alone (tests/cuda, 16 workers in the order tests/cuda/test_cuda.py
     gives, one thread each), every test's outcome and duration by name;
  b. ``two_ranks``: fairseq's distributed trainer, 2 gloo ranks on the one GPU in fp16, every
     ``_tiny`` preset, against one rank with ``--update-freq 2`` (benchmarks/two_ranks.py);
  c. ``profile``: benchmarks/profile_steps.py on the MoE layer;
  d. ``speed``: the speed figures of docs/gpu.md (:func:`speed_commands`): the MoE layer against
     its dense share, every architecture's utilisation against its stock twin, PartialFormer's attention
     kernels side by side (fused_attention.py) and its decoding.

It runs in two parts: ``--part correctness`` (a, b: about 400 s on an H100) and ``--part speed`` (c,
d: at most 300 s); ``--part all`` runs both. Writes OUT/report.json (everything, after every step),
OUT/report.md (tables docs/gpu.md takes as they are) and OUT/<step>.log. ``--dry-run`` runs every
step with CPU stand-ins (bf16 for fp16, the gloo ranks on the CPU for one preset, a few updates,
tiny sizes; the tier's tests skip themselves without CUDA, and are listed by name) and writes the
same report: tests/test_gpu_check.py runs it, so the command cannot rot while no GPU runs it.
    python benchmarks/gpu_check.py OUT [--part correctness|speed|all] [--data .gpu/multi30k] [--dry-run]
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
PY = sys.executable

#: PartialFormer's attention kernels beside its default (``auto``).
PARTIALFORMER = "partialformer_24_6_d360_h30_16"
#: The speed part's commands with their limits add up to 260 s: with the MoE profile's 40 s, within
#: one 300-second command after the correctness part.
SPEED_SECONDS = 260


def speed_commands(dry: bool) -> list:
    """(name, seconds allowed, argv) of every speed figure, most wanted first: the MoE layer against
    its dense share (8,192 and 16,384 tokens, fp16 and bf16), every architecture's utilisation in bf16
    against its stock twin (the paper-size presets of ``training_utilisation.SYSTEMS``), PartialFormer's
    three attention kernels in one model, its decoding per MAC."""
    if dry:
        dev = ["--device", "cpu", "--dtype", "bf16"]
        return [("moe bf16 256 tokens", 120, [BENCH / "moe_throughput.py", *dev, "--tokens", "256", "--dim", "32",
                                              "--ffn", "64", "--rounds", "1", "--repeats", "1", "--child"]),
                ("widenet utilisation bf16 batch 4", 200,
                 [BENCH / "training_utilisation.py", *dev, "--systems", "widenet_tiny", "--vocab", "500",
                  "--batch-size", "4", "--steps", "1", "--rounds", "1"]),
                ("fused attention bf16", 120,
                 [BENCH / "fused_attention.py", *dev, "--systems", "partialformer_tiny", "--vocab", "500",
                  "--batch-size", "2", "--steps", "1", "--rounds", "1"]),
                ("partialformer decoding bf16", 200,
                 [BENCH / "partialformer_speed.py", *dev, "--vocab", "500", "--batch-size", "1", "--batches", "1",
                  "--rounds", "1", "--src-len", "4", "--tgt-len", "4"])]
    commands = [(f"moe {dtype} {tokens} tokens", 20,
                 [BENCH / "moe_throughput.py", "--device", "cuda", "--dtype", dtype, "--tokens", tokens,
                  "--dim", "768", "--ffn", "3072"])
                for tokens in (8192, 16384) for dtype in ("fp16", "bf16")]
    # 6 steps x 3 rounds per side: 3 x 2 gave ratios that moved by up to 0.4 between two runs
    commands.append(("utilisation bf16 batch 544", 105,  # 544 x 30 = 16,320 tokens
                     [BENCH / "training_utilisation.py", "--device", "cuda", "--dtype", "bf16", "--batch-size", 544,
                      "--steps", "6", "--rounds", "3"]))
    # PartialFormer's three attention kernels side by side, the causal kernel, logits as SDPA's bias
    commands.append(("fused attention fp16", 50,
                     [BENCH / "fused_attention.py", "--device", "cuda", "--dtype", "fp16", "--batch-size", "128",
                      "--systems", f"{PARTIALFORMER},multipath_transformer_6l_4p"]))
    commands.append(("partialformer decoding fp16", 25,
                     [BENCH / "partialformer_speed.py", "--device", "cuda", "--dtype", "fp16", "--batch-size", "128"]))
    return commands


def keep_order() -> list:
    """pytest-xdist's flag that hands the tier out in tests/cuda's order (xdist >= 3.2 sorts the
    units by size unless told not to; older ones keep the order and lack the flag)."""
    import inspect

    import xdist.plugin
    return ["--no-loadscope-reorder"] if "loadscopereorder" in inspect.getsource(xdist.plugin) else []


def steps(args) -> list:
    """(name, seconds allowed, [(label, seconds, argv, env)])."""
    dry, data = args.dry_run, Path(args.data).resolve()  # the steps run in benchmarks/
    # one thread per test process: 16 workers, each training in a subprocess, share 16 cores
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "WIDEARCH_CUDA_REPORT": str(Path(args.out) / "tier_figures.jsonl")}  # each test's measured figures
    tier = [PY, "-m", "pytest", REPO / "tests" / "cuda", "-m", "cuda", "-v", "-rA", "--tb=short", "--durations=0",
            "-p", "no:cacheprovider", "--junitxml", Path(args.out) / "tier.xml", "--multi30k-data", data,
            *([] if dry else ["-n", "16", "--dist", "loadgroup", *keep_order()])]
    two = [BENCH / "two_ranks.py", "--data", data / "bin", "--device", "cpu" if dry else "cuda",
           "--precision", "bf16" if dry else "fp16", "--updates", "2" if dry else "24",
           *(["--archs", "multipath_transformer_tiny"] if dry else [])]  # tests/test_two_ranks.py: every preset
    profile = [BENCH / "profile_steps.py", *(
        ["--device", "cpu", "--dtype", "bf16", "--cases", "moe,train", "--systems", "widenet_tiny", "--vocab", "500",
         "--batch-size", "4", "--tokens", "64", "--dim", "32", "--ffn", "64", "--steps", "1"] if dry
        else ["--device", "cuda", "--dtype", "fp16", "--cases", "moe"])]
    collect = [PY, "-m", "pytest", REPO / "tests" / "cuda", "-m", "cuda", "--collect-only", "-q", "-p",
               "no:cacheprovider"]
    return [("tier", args.tier_seconds, [("collect", 30, collect, env), ("tier", args.tier_seconds, tier, env)]),
            ("two_ranks", 240 if dry else 75, [("two_ranks", 240 if dry else 75, [PY, *two], {})]),
            ("profile", 200 if dry else 40, [("profile", 200 if dry else 40, [PY, *profile], {})]),
            ("speed", 400 if dry else args.speed_seconds, [(n, s, [PY, *a], {}) for n, s, a in speed_commands(dry)])]


def run_step(name, allowed, commands, log_path) -> dict:
    """Run the step's commands in turn, each under its own limit and all within ``allowed``."""
    start, results = time.monotonic(), {}
    with open(log_path, "w") as log:
        for label, seconds, argv, env in commands:
            left = allowed - (time.monotonic() - start)
            if left < 5:
                results[label] = {"rc": None, "seconds": 0, "timed_out": True, "note": "no time left in the step"}
                continue
            log.write(f"\n===== {label}: {' '.join(map(str, argv))}\n")
            log.flush()
            t0 = time.monotonic()
            try:
                proc = subprocess.run([str(a) for a in argv], cwd=BENCH, capture_output=True, text=True,
                                      timeout=min(seconds, left), env={**os.environ, **env,
                                                                       "PYTHONPATH": f"{REPO}:{BENCH}"})
                out, rc, timed_out = proc.stdout + proc.stderr, proc.returncode, False
            except subprocess.TimeoutExpired as expired:
                out = (expired.stdout or b"").decode() + (expired.stderr or b"").decode() if isinstance(
                    expired.stdout, bytes) else (expired.stdout or "") + (expired.stderr or "")
                rc, timed_out = None, True
            log.write(out)
            results[label] = {"rc": rc, "seconds": round(time.monotonic() - t0, 1), "timed_out": timed_out,
                              "json": last_json(proc.stdout if not timed_out else "")}
            if timed_out:  # what a benchmark printed before its limit (a line per system measured)
                results[label]["partial"] = [line.strip() for line in out.splitlines() if " ratio " in line]
            if name == "tier":
                results[label]["summary"] = next((line.strip("= ") for line in reversed(out.splitlines())
                                                  if re.search(r"\b(passed|failed|skipped|error)", line)), None)
    return results


def last_json(stdout: str):
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def tier_outcomes(xml_path: Path, log: str) -> dict:
    """test id -> passed / failed / error / skipped, from pytest's JUnit XML (then removed), or
    where the tier was cut short (no XML), from its ``-v`` lines, the tests it did not reach named
    ``not reached``."""
    if not xml_path.exists():
        test = r"\S*test_cuda\.py::(\S+?)(?:@\S+)?(?=\s|$)"  # xdist's -v lines name tests with @<group>
        ended = {name: outcome.lower() for outcome, name in re.findall(rf"(PASSED|FAILED|ERROR|SKIPPED) {test}", log, re.M)}
        collected = re.findall(rf"^{test}", log, re.M)
        return {f"test_cuda::{name}": ended.get(name, "not reached") for name in dict.fromkeys([*collected, *ended])}
    outcomes = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        message = next((child.get("message", "") for child in case if child.tag == outcome), "")
        outcomes[f"{case.get('classname').split('.')[-1]}::{case.get('name')}"] = \
            {"failure": "failed"}.get(outcome, outcome) + (f": {message[:200]}" if message else "")
    xml_path.unlink()
    return outcomes


def tier_figures(path: Path) -> list:
    """The figures the tier's tests measured (BLEU of each decoding, log-probability differences,
    losses and loss scales), one dict per test (tests/cuda/test_cuda.py, ``report``); the file removed."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.unlink()
    return rows


def machine() -> dict:
    cuda = torch.cuda.is_available()
    return {"gpu": torch.cuda.get_device_name() if cuda else "none (CPU stand-ins)", "torch": torch.__version__,
            "cuda": torch.version.cuda if cuda else None, "python": platform.python_version(),
            "cpus": os.cpu_count()}


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"Machine: {m['gpu']}, torch {m['torch']}, CUDA {m['cuda']}, Python {m['python']}, {m['cpus']} cores"
             f"{' (dry run)' if report['dry_run'] else ''}.", "", "| step | command | exit | seconds | cut by its limit |",
             "|---|---|---|---|---|"]
    for step, commands in report["steps"].items():
        for label, res in commands.items():
            lines.append(f"| {step} | {label} | {res['rc']} | {res['seconds']} | {'yes' if res['timed_out'] else ''} |")
    tier = report["steps"]["tier"].get("tier", {})
    lines += ["", f"**CUDA tier**: {tier.get('summary')}", "", "| test | outcome |", "|---|---|"]
    lines += [f"| `{name}` | {outcome} |" for name, outcome in report.get("tier_tests", {}).items()]
    decoding = [row for row in report.get("tier_figures", []) if row.get("test") == "decoding"]
    if decoding:
        lines += ["", "| decoding (half of test_2016) | fp32 BLEU | half BLEU |", "|---|---|---|"]
        lines += [f"| {row['arch']} {row['half']} | {row['bleu_fp32']:.2f} | {row['bleu_half']:.2f} |" for row in decoding]
    two = report["steps"]["two_ranks"].get("two_ranks", {}).get("json")
    if two:
        lines += ["", f"**Two ranks, {two['precision']}, {two['ddp_backend']}, {two['updates']} updates** "
                      f"(tolerance {two['tolerance']} relative on each update's loss)", "",
                  "| preset | ranks identical | largest relative loss difference to one rank x update-freq 2 "
                  "| largest parameter difference | skipped updates (two ranks / one rank) | ok |",
                  "|---|---|---|---|---|---|"]
        for arch, res in two["results"].items():
            skipped = res.get("overflows") or {}
            lines.append(f"| {arch} | {res.get('ranks_identical')} | {res.get('max_relative_loss_difference')} | "
                         f"{res.get('max_abs_parameter_difference')} | {skipped.get('two_ranks')} / "
                         f"{skipped.get('one_rank')} | {res['ok']} |")
    lines += ["", "**Speed**", "", "| figure | result |", "|---|---|"]
    for label, res in report["steps"]["speed"].items():
        partial = "cut at its limit after: " + "; ".join(res.get("partial") or []) if res.get("partial") else "no result"
        lines.append(f"| {label} | {speed_summary(res['json']) if res.get('json') else partial} |")
    prof = report["steps"]["profile"].get("profile", {}).get("json") or {}
    lines += ["", "**Profile** (device ms and kernels per step; top three operators)", "", "| case | model | ms | kernels "
              "| top operators |", "|---|---|---|---|---|"]
    for case, models in prof.items():
        if not isinstance(models, dict) or case in ("device", "dtype"):
            continue
        flat = models.items() if case != "train" else [(f"{s} / {n}", r) for s, pair in models.items()
                                                       for n, r in pair.items()]
        for name, res in flat:
            top = "; ".join(f"{op} {ms}" for op, ms, _ in res["top_ops"][:3])
            lines.append(f"| {case} | {name} | {res['ms_per_step']} | {res['kernels_per_step']} | {top} |")
    return "\n".join(lines) + "\n"


def speed_summary(res: dict) -> str:
    if "candidates" in res:  # the committed reports of when the MoE layer had several ways to move tokens
        return (f"dense FFN {res['dense_ms']} ms; MoE / K·C dense: " +
                ", ".join(f"{d} {c['ratio']} ({c['ms']} ms)" for d, c in res["candidates"].items()) + " (target <= 1.15)")
    if "moe_ms" in res:  # moe_throughput.py
        return (f"MoE {res['moe_ms']} ms, dense FFN {res['dense_ms']} ms; MoE / K·C dense {res['ratio']} "
                "(target <= 1.15)")
    systems = {k: v for k, v in res.items() if isinstance(v, dict) and "ratio" in v}
    if "partialformer_logits_as_bias" in systems:  # fused_attention.py: each ratio within one model, alternating rounds
        bias = systems.pop("partialformer_logits_as_bias")
        kernels = res.get("kernels", {})  # older reports have none
        return ("causal kernel after / before: " + ", ".join(f"{k} {v['ratio']}" for k, v in systems.items()) +
                f"; head-scaled logits as SDPA's bias / explicit {bias['ratio']}" +
                ("; step time / auto's: " + ", ".join(f"{system} {kernel} {ratio}" for system, ks in kernels.items()
                                                      for kernel, ratio in ks.items() if kernel.endswith("/auto"))
                 if kernels else ""))
    if systems:
        return "MFU ratio to the stock twin: " + ", ".join(f"{k} {v['ratio']}" for k, v in systems.items())
    return ", ".join(f"{k} {v}" for k, v in res.items() if isinstance(v, (int, float)))


#: The two parts of the check (docs/gpu.md, "The GPU check"), each within a 10-minute limit.
PARTS = {"correctness": "tier,two_ranks", "speed": "profile,speed", "all": "tier,two_ranks,profile,speed"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="where report.json, report.md and the logs go")
    p.add_argument("--data", default=str(REPO / ".gpu" / "multi30k"),
                   help="the quick start's prepared Multi30k (bin/, bpe/codes, test.ref.de)")
    p.add_argument("--dry-run", action="store_true", help="CPU stand-ins for every step")
    p.add_argument("--part", choices=PARTS, default="all",
                   help="correctness = the CUDA tier and two ranks, speed = the MoE profile and the speed "
                        "figures, all = both")
    p.add_argument("--steps", help="the steps to run, comma-separated (overrides --part; reruns what a run "
                                   "cut short missed)")
    p.add_argument("--tier-seconds", type=int, default=300, help="the tier's limit")
    p.add_argument("--speed-seconds", type=int, default=SPEED_SECONDS, help="the speed step's limit")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        p.error("no CUDA GPU here: use --dry-run for the CPU stand-ins")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = (args.steps or PARTS[args.part]).split(",")
    report = {"dry_run": args.dry_run, "machine": machine(), "steps": {}}
    for name, allowed, commands in steps(args):
        report["steps"][name] = {}
        if name not in wanted:
            continue
        report["steps"][name] = run_step(name, allowed, commands, out / f"{name}.log")
        print(f"{name}: " + ", ".join(f"{label} rc {r['rc']} in {r['seconds']} s" for label, r in
                                      report["steps"][name].items()), flush=True)
        if name == "tier":
            report["tier_tests"] = tier_outcomes(out / "tier.xml", (out / "tier.log").read_text())
            report["tier_figures"] = tier_figures(out / "tier_figures.jsonl")
        # written after every step: a run cut short by a time limit still leaves what ran
        (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
