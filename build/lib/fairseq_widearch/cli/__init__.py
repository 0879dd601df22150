"""Command-line tools (``python -m fairseq_widearch.cli.<tool>``), and the argument types they share,
so that a bad argument ends in one line naming it and what it accepts (argparse's ``error:`` line),
never in a traceback. Each type carries ``accepts`` (what it takes) and ``invalid`` (the values it
refuses at each of its bounds), from which tests/test_wrong_input.py finds what to give every tool's every argument."""
import argparse
import math
import os
from typing import Callable, List


def _checked(convert: Callable, valid: Callable, accepts: str, *invalid: str) -> Callable:
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not valid(value):
            raise argparse.ArgumentTypeError(f"takes {accepts}, got {text!r}")
        return value

    parse.__name__, parse.accepts, parse.invalid = convert.__name__, accepts, invalid
    return parse


def whole(low: int = 0, meaning: str = "") -> Callable:
    """An argparse type: a whole number >= ``low`` (``meaning``: what a value stands for, e.g. "0: all")."""
    return _checked(int, lambda v: v >= low, f"a whole number >= {low}" + (f" ({meaning})" if meaning else ""),
                    str(low - 1))


def number(low: float = None, high: float = None, meaning: str = "", low_included: bool = False) -> Callable:
    """An argparse type: a finite real number, above ``low`` (or at it, ``low_included``) and below
    ``high``, where given."""
    bounds = " and ".join([*([f"{'at least' if low_included else 'above'} {low:g}"] if low is not None else []),
                           *([f"below {high:g}"] if high is not None else [])])
    above = (lambda v: v >= low) if low_included else (lambda v: v > low)
    return _checked(float, lambda v: math.isfinite(v) and (low is None or above(v)) and (high is None or v < high),
                    "a number" + (f" {bounds}" if bounds else "") + (f" ({meaning})" if meaning else ""),
                    *([f"{low - low_included:g}"] if low is not None else []), *([f"{high:g}"] if high is not None else []),
                    "nan")


existing = _checked(str, os.path.exists, "an existing file or directory", "/no/such/path")
existing.__name__ = "path"
existing_file = _checked(str, os.path.isfile, "an existing file", "/")
existing_file.__name__ = "file"
existing_dir = _checked(str, os.path.isdir, "an existing directory", "/no/such/directory")
existing_dir.__name__ = "directory"
#: A path to write: its directory must exist (checked before any work, not after it).
output = _checked(str, lambda path: os.path.isdir(os.path.dirname(os.path.abspath(path))),
                  "a path in an existing directory", "/no/such/directory/out")
output.__name__ = "output"


def check_subset(parser: argparse.ArgumentParser, data: str, subset: str):
    """Exit in one line (argparse's) unless the data directory ``data`` holds the split ``subset``."""
    if not any(name.startswith(f"{subset}.") for name in os.listdir(data)):
        parser.error(f"argument --subset: {data} holds no {subset!r} split")


def widths(text: str) -> List[int]:
    """A comma-separated list of positive integers (``--layer-widths``).

    Raises:
        argparse.ArgumentTypeError: naming the text, if an item is not a positive integer."""
    try:
        values = [int(w) for w in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"takes comma-separated positive integers, got {text!r}")
    return values


widths.accepts, widths.invalid = "comma-separated positive integers", ("0,64",)
