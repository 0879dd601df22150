#!/usr/bin/env python
"""A training killed while fairseq copies a saved checkpoint to ``checkpoint_last.pt``: is the
file left readable? (docs/usage.md, "When a worker dies or hangs").

fairseq saves each checkpoint (``checkpoint_<epoch>_<update>.pt`` with ``--save-interval-updates``)
and copies it to ``checkpoint_last.pt``. Each trial starts ``fairseq-train`` saving after every
update, watches its save directory and sends it SIGKILL as soon as a copy to
``checkpoint_last.pt`` is under way (from the second save on, so that a previous copy exists): in
fairseq's own copy, ``checkpoint_last.pt`` shorter than the checkpoint it copies; in the plugin's
(``fairseq_fixes.checkpoint_copies_are_atomic``), its temporary file present. Then it loads
``checkpoint_last.pt``. ``--stock`` runs fairseq's copy (the plugin imported, that fix undone).
A trial whose training ended before a copy was seen under way counts as missed.

Reports per mode the trials, the kills during a copy, and the ``checkpoint_last.pt`` files left
unreadable or readable (with the update they hold). The last line is one JSON object.

    python benchmarks/kill_during_saves.py --data runs/multi30k/data/bin --trials 10
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import fairseq_widearch  # noqa: F401  (its checkpoints load with weights_only)
from fairseq_widearch.experiments.settings import criterion_flags

#: The worker: fairseq-train with the plugin, its atomic copy undone under ``--stock``.
WORKER = """
import sys
from fairseq.file_io import PathManager
copy = PathManager.copy
import fairseq_widearch
if sys.argv.pop(1) == "stock":
    PathManager.copy = copy
from fairseq_cli.train import cli_main
cli_main()
"""


def copy_under_way(save: Path, stock: bool) -> bool:
    """Whether a copy to checkpoint_last.pt is under way now (after a first one ended)."""
    names = {e.name: e for e in os.scandir(save)}
    saved = sorted((n for n in names if n.startswith("checkpoint_1_") and n.endswith(".pt")),
                   key=lambda n: int(n[len("checkpoint_1_"):-3]))
    if len(saved) < 2:
        return False
    if not stock:
        return "checkpoint_last.pt.tmp" in names
    try:
        return "checkpoint_last.pt" in names and names["checkpoint_last.pt"].stat().st_size < \
            names[saved[-1]].stat().st_size
    except FileNotFoundError:
        return False


def trial(args, save: Path, stock: bool) -> dict:
    cmd = [sys.executable, "-c", WORKER, "stock" if stock else "plugin", args.data, "--user-dir",
           str(Path(fairseq_widearch.__file__).parent), "--arch", args.arch, *criterion_flags(["--arch", args.arch]),
           "--save-dir", str(save), "--cpu", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "512",
           "--max-update", str(args.max_update), "--save-interval-updates", "1", "--no-epoch-checkpoints",
           "--disable-validation", "--num-workers", "0", "--seed", "1", "--log-format", "simple"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed = False
    while proc.poll() is None:
        if save.is_dir() and copy_under_way(save, stock):
            proc.send_signal(signal.SIGKILL)
            killed = True
            break
    proc.wait()
    if not killed:
        return {"killed_during_copy": False}
    try:
        state = torch.load(save / "checkpoint_last.pt", weights_only=False, map_location="cpu")
        return {"killed_during_copy": True, "readable": True,
                "updates": state["optimizer_history"][-1]["num_updates"]}
    except Exception as e:  # noqa: BLE001  (any failure to read is the finding)
        return {"killed_during_copy": True, "readable": False, "error": type(e).__name__}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="fairseq data directory (Multi30k En-De)")
    p.add_argument("--arch", default="widenet_multi30k", help="its checkpoint's size sets how long a copy takes")
    p.add_argument("--trials", type=int, default=10, help="trials per mode")
    p.add_argument("--max-update", type=int, default=40)
    p.add_argument("--modes", default="stock,plugin")
    args = p.parse_args(argv)
    results = {}
    for mode in args.modes.split(","):
        rows = []
        for i in range(args.trials):
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(trial(args, Path(tmp) / "save", mode == "stock"))
        hit = [r for r in rows if r["killed_during_copy"]]
        results[mode] = {"trials": len(rows), "killed_during_copy": len(hit),
                         "unreadable": sum(not r["readable"] for r in hit),
                         "readable": sum(r["readable"] for r in hit), "rows": rows}
        print(f"{mode:>7}: {len(hit)} of {len(rows)} trials killed during a copy; checkpoint_last.pt "
              f"unreadable after {results[mode]['unreadable']}, readable after {results[mode]['readable']}",
              flush=True)
    print(json.dumps({"arch": args.arch, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, **results}))


if __name__ == "__main__":
    main()
