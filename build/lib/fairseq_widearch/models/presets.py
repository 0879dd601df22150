"""Helpers for ``register_model_architecture`` presets, shared by every architecture."""
from fairseq.models import register_model_architecture


def set_defaults(args, **values):
    """Set each ``args.<name>`` to ``value`` unless the user (or a more specific preset that ran
    first) already set it: fairseq's preset convention ``args.x = getattr(args, "x", default)``."""
    for name, value in values.items():
        setattr(args, name, getattr(args, name, value))


def set_unset(args, **values):
    """``args.<name> = value`` where the flag is absent or None (a criterion flag left unset)."""
    for name, value in values.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


#: The quick-start body every architecture's ``_multi30k`` preset starts from, sized for
#: Multi30k on 2 CPU cores: d = 128, FFN 512, 4 heads, 3 + 3 layers, shared vocabulary.
MULTI30K_BODY = dict(encoder_embed_dim=128, encoder_ffn_embed_dim=512, encoder_attention_heads=4, encoder_layers=3,
                     decoder_layers=3, decoder_attention_heads=4, share_all_embeddings=True)


def register_preset(model: str, name: str, base, doc: str, **values):
    """Register ``name`` as a delta preset: ``values`` as defaults, then the ``base`` preset."""

    def preset(args):
        set_defaults(args, **values)
        base(args)

    preset.__doc__ = doc
    return register_model_architecture(model, name)(preset)
