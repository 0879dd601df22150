"""Run a benchmark twice, in fresh processes, under two glibc malloc settings.

glibc serves blocks above its mmap threshold (adaptive, at most 32 MB) with fresh mmaps, and
returns freed memory above its trim threshold to the OS, so large transient tensors pay page
faults on every training step. Wide layers (n paths, E experts) have larger transients than the
deep or dense layers they are compared with, so the allocator alone can decide a comparison.
Each benchmark therefore reports both: glibc's defaults and ``REUSE_FREED_MEMORY`` (the setting
``examples/multi30k/quickstart.sh`` trains with).
"""
import json
import os
import subprocess
import sys

#: glibc settings that keep freed memory in the process (1 GB thresholds).
REUSE_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": "1000000000", "MALLOC_TRIM_THRESHOLD_": "1000000000"}


def run_child(script: str, argv, extra_env) -> dict:
    """Run ``script --child *argv`` with ``extra_env`` added; return its last output line as JSON."""
    env = {**os.environ, **extra_env}
    out = subprocess.run([sys.executable, script, "--child", *argv], env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def both_modes(script: str, argv) -> tuple:
    """``(default_result, reuse_result)`` of ``script`` run under each malloc setting."""
    return run_child(script, argv, {}), run_child(script, argv, REUSE_FREED_MEMORY)
