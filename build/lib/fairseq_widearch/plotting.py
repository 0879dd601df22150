"""What the plotting tools and the experiments share: a headless pyplot and a checkpoint's training
step."""
import logging
import sys


def pyplot():
    """matplotlib.pyplot on the Agg backend (PNG files, no display).

    Raises:
        SystemExit: if matplotlib is not installed, saying how to install it.
    """
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's loaders set the root logger to DEBUG
    try:
        import matplotlib
    except ImportError:
        sys.exit("error: plotting needs matplotlib: pip install -e '.[plots]' in the checkout")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def num_updates(state: dict) -> int:
    """Updates a fairseq checkpoint ``state`` was trained for."""
    return state["optimizer_history"][-1]["num_updates"]
