"""Helpers for ``register_model_architecture`` presets, shared by every architecture."""


def set_defaults(args, **values):
    """Set each ``args.<name>`` to ``value`` unless the user (or a more specific preset that ran
    first) already set it: fairseq's preset convention ``args.x = getattr(args, "x", default)``."""
    for name, value in values.items():
        setattr(args, name, getattr(args, name, value))
