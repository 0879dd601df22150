"""Build-time checks of model, criterion and task flags, shared by every architecture: a bad config
fails when it is built, with a message naming the flag and its value (not deep inside a forward)."""
import os
import sys

import fairseq_cli

#: The folder of fairseq's command-line programs (fairseq-train, fairseq-generate, fairseq-hydra-train, ...).
_PROGRAMS = os.path.dirname(os.path.abspath(fairseq_cli.__file__))


class ConfigurationError(ValueError):
    """A configuration the plugin refuses; the message names the flag, its value and what it accepts."""


def _under_fairseq_program() -> bool:
    """Whether a fairseq program's entry point (``fairseq_cli.<tool>.cli_main``, which its console
    script, ``python -m``, torchrun's workers and fairseq-hydra-train call) is on the stack; a script
    that calls ``fairseq_cli.train.main`` itself is not one."""
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "cli_main" and os.path.dirname(os.path.abspath(code.co_filename)) == _PROGRAMS:
            return True
        frame = frame.f_back
    return False


def refuse(message: str, error: type = ConfigurationError):
    """Refuse a configuration (or an input: ``error``). Under a fairseq command-line program
    (fairseq-train, ``python -m fairseq_cli.train``, fairseq-generate, fairseq-hydra-train) the
    program ends as fairseq's own argument errors end: the line ``<program>: error: <message>`` on
    stderr, exit status 2, no traceback (under torchrun each worker ends so, and torchrun reports
    their exit). Elsewhere (the hub, a script building a model) it raises ``error(message)``.

    Raises:
        ConfigurationError: (or ``error``) outside a fairseq command-line program.
        SystemExit: under one.
    """
    if _under_fairseq_program():
        print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    raise error(message) from None


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def require(condition: bool, message: str):
    """``refuse(message)`` unless ``condition``."""
    if not condition:
        refuse(message)


def require_positive(args, *names: str):
    """Refuse (``refuse``) naming the first of ``names`` whose value in ``args`` is not a positive integer."""
    for name in names:
        value = getattr(args, name)
        require(isinstance(value, int) and value > 0, f"{_flag(name)} must be a positive integer, got {value!r}")


def validate_transformer_sizes(args):
    """Check fairseq's Transformer size flags: positive sizes, heads dividing the width.

    Raises:
        ConfigurationError: naming the offending flag and value (``refuse``).
    """
    for side in ("encoder", "decoder"):
        require_positive(args, f"{side}_embed_dim", f"{side}_ffn_embed_dim", f"{side}_layers",
                         f"{side}_attention_heads")
        dim, heads = getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_attention_heads")
        require(dim % heads == 0,
                f"--{side}-attention-heads {heads} does not divide --{side}-embed-dim {dim}")


def reject_unapplied(args, arch: str, *names: str):
    """Refuse (``refuse``) naming the first of fairseq's Transformer flags ``names`` that is set
    (non-zero, True) although ``arch``'s own layers do not apply it (layer drop, quantization noise,
    cross+self-attention), instead of training silently without it."""
    for name in names:
        value = getattr(args, name, None)
        require(not value, f"{_flag(name)} {value} is not applied by {arch}'s layers: leave it out")
