"""Training runs for studies that span days and machines (the claims study, the comparison):
each run trains in its own directory with ``fairseq-train``, resumes there when interrupted, refuses
to resume under other flags, and leaves one result row per run in a JSON-lines file kept apart
from the runs (this project keeps its files in git under ``docs/data``), so that a new machine
picks a study up where the file says it stands.
"""
import argparse
import json
import os
import re
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, List, Sequence

import torch

from .scoring import BIN, USER_DIR


def data_arguments(description: str) -> argparse.ArgumentParser:
    """A parser with the Multi30k data flags of a study: ``--data``, ``--bpe-codes``, ``--ref``."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="fairseq data directory (En-De, joined dictionary)")
    p.add_argument("--bpe-codes", required=True)
    p.add_argument("--ref", required=True, help="raw German reference of test_2016")
    return p


def same_training(save: Path, flags: Sequence) -> None:
    """Record in ``save/flags.json`` the flags that decide a training (paths by their file names, so
    that a moved work directory still matches; not the stopping flags, which a resumed run may
    raise), or check them against the record of an earlier start.

    Raises:
        ValueError: when ``save`` holds a training started with other flags: fairseq would resume
            its checkpoint under the new flags without a word (the system was changed since).
    """
    record, flags = save / "flags.json", [f.name if isinstance(f, Path) else str(f) for f in flags]
    if record.exists() and json.loads(record.read_text()) != flags:
        raise ValueError(f"{save} holds a training started with other flags than this system's now "
                         f"({json.loads(record.read_text())}); move it away to train the system afresh")
    save.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(flags))


def fairseq_train(data, save: Path, flags: Sequence, stop: Sequence = (), cpu: bool = True,
                  log_interval: int = 100) -> dict:
    """Train (or resume) ``fairseq-train data --user-dir <plugin> flags`` in ``save`` until the
    ``stop`` flags end it (``--max-epoch``/``--patience``, ``--max-update``, ``--stop-time-hours``);
    its log goes to ``save/train.log``. Returns the epochs, updates and training seconds (fairseq's
    cumulative training time), also kept in ``save/training.json``, which marks the training
    finished: a finished training is not started again (fairseq-train would train once more).

    Raises:
        ValueError: when ``save`` holds a training started with other ``flags`` (``same_training``).
        subprocess.CalledProcessError: if fairseq-train fails (its output in ``save/train.log``).
    """
    finished = save / "training.json"
    same_training(save, flags)  # before the finished shortcut: a finished run of other flags is not this one
    if finished.exists():
        return json.loads(finished.read_text())
    cmd = [BIN / "fairseq-train", data, "--user-dir", USER_DIR, *(["--cpu"] if cpu else []), "--num-workers", "0",
           *flags, "--save-dir", save, *stop, "--log-format", "simple", "--log-interval", log_interval]
    with open(save / "train.log", "a") as log:
        subprocess.run([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, check=True)
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu")
    # fairseq stores the iterator's next epoch at an epoch's end, the epoch under way in mid-epoch:
    # either way the epochs completed are one fewer
    training = {"epochs": state["extra_state"]["train_iterator"]["epoch"] - 1,
                "updates": state["optimizer_history"][-1]["num_updates"],
                "train_seconds": round(state["extra_state"]["previous_training_time"], 1)}
    finished.write_text(json.dumps(training))
    return training


class Results:
    """A JSON-lines file of result rows, one per run, a run named by the values of ``key`` (e.g.
    ``("system", "seed")``); rows are added as runs finish, from several threads at once."""

    def __init__(self, path: Path, key: Sequence[str]):
        self.path, self.key, self.lock = path, tuple(key), threading.Lock()
        self.rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def run_of(self, row: dict) -> tuple:
        """The values of ``key`` in ``row``: the run it belongs to (KeyError if one is missing)."""
        return tuple(row[k] for k in self.key)

    def add(self, rows: List[dict]):
        """Record ``rows``, each replacing an earlier row of its run (one scored another way)."""
        with self.lock:
            new = {self.run_of(r) for r in rows}
            self.rows = [r for r in self.rows if self.run_of(r) not in new] + rows
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))


def share_cores(device: str, at_once: int) -> None:
    """On a CPU, give each of ``at_once`` training subprocesses one N-th of the cores through
    ``OMP_NUM_THREADS`` (inherited by the subprocesses; a value the user set is kept). Torch's
    default, all cores per run, oversubscribes the cores and slows every run down."""
    if device == "cpu":
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // at_once)))


def run_jobs(run: Callable, jobs: Iterable[tuple], at_once: int):
    """``run(*job)`` for every job, ``at_once`` at a time. A failure is raised only once every job
    has ended: a failed or killed run must not cost the rows of the runs beside it."""
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        futures = [pool.submit(run, *job) for job in jobs]
    for future in futures:
        future.result()


def train_inner(log: str) -> list:
    """fairseq-train's ``--log-format json`` train_inner records in ``log`` (its own CLI's format,
    ``... | train_inner | {...}``, or Python logging's default, ``INFO:train_inner:{...}``), in order,
    each figure as a float (fairseq writes them as strings; non-numbers are left out)."""
    records = [json.loads(m) for m in re.findall(r"train_inner(?: \| |:)(\{.*\})", log)]
    return [{k: float(v) for k, v in r.items() if re.fullmatch(r"-?[\d.]+(e[-+]?\d+)?|-?inf|nan", str(v))}
            for r in records]
