"""Build-time checks of model flags, shared by every architecture: a bad config fails when the
model is built, with a message naming the flag and its value (not deep inside a forward)."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def require(condition: bool, message: str):
    """Raise ``ValueError(message)`` unless ``condition``."""
    if not condition:
        raise ValueError(message)


def require_positive(args, *names: str):
    """Raise ``ValueError`` naming the first of ``names`` whose value in ``args`` is not a positive integer."""
    for name in names:
        value = getattr(args, name)
        require(isinstance(value, int) and value > 0, f"{_flag(name)} must be a positive integer, got {value!r}")


def validate_transformer_sizes(args):
    """Check fairseq's Transformer size flags: positive sizes, heads dividing the width.

    Raises:
        ValueError: naming the offending flag and value.
    """
    for side in ("encoder", "decoder"):
        require_positive(args, f"{side}_embed_dim", f"{side}_ffn_embed_dim", f"{side}_layers",
                         f"{side}_attention_heads")
        dim, heads = getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_attention_heads")
        require(dim % heads == 0,
                f"--{side}-attention-heads {heads} does not divide --{side}-embed-dim {dim}")


def reject_unapplied(args, arch: str, *names: str):
    """Raise ``ValueError`` naming the first of fairseq's Transformer flags ``names`` that is set
    (non-zero, True) although ``arch``'s own layers do not apply it (layer drop, quantization noise,
    cross+self-attention), instead of training silently without it."""
    for name in names:
        value = getattr(args, name, None)
        require(not value, f"{_flag(name)} {value} is not applied by {arch}'s layers: leave it out")
