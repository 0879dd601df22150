"""Command-line tools (``python -m fairseq_widearch.cli.<tool>``), and the checks of their arguments
they share, so that a bad argument ends in one line naming it rather than a traceback."""
import argparse
import os
from typing import List


def require(*paths: str):
    """Exit naming the paths that do not exist, in one line, as argparse names a bad argument.

    Raises:
        SystemExit: with ``error: no such file or directory: ...``, if one of ``paths`` is missing."""
    missing = [str(path) for path in paths if path is not None and not os.path.exists(path)]
    if missing:
        raise SystemExit(f"error: no such file or directory: {', '.join(missing)}")


def widths(text: str) -> List[int]:
    """A comma-separated list of positive integers (``--layer-widths``).

    Raises:
        argparse.ArgumentTypeError: naming the text, if an item is not a positive integer."""
    try:
        values = [int(w) for w in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"comma-separated positive integers, got {text!r}")
    return values
