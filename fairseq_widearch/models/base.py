"""What every Transformer variant of the plugin shares: flags from one config dataclass, and a
build that applies the base preset and validates the flags before fairseq builds the model."""
from dataclasses import fields

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)


def added_defaults(config_cls) -> dict:
    """``{field: default}`` of the fields ``config_cls`` adds to fairseq's TransformerConfig."""
    base = {f.name for f in fields(TransformerConfig)}
    return {f.name: f.default for f in fields(config_cls) if f.name not in base}


class WideTransformerModel(TransformerModel):
    """Subclasses set ``config`` (a TransformerConfig subclass whose fields are the model's flags),
    ``encoder_class`` and ``decoder_class``, and implement ``base_preset(args)`` and
    ``validate(args)`` (raises ``ValueError`` naming the flag). The encoder and decoder are built
    from fairseq's TransformerConfig, which carries the subclass's fields."""

    config = TransformerConfig
    encoder_class = TransformerEncoderBase
    decoder_class = TransformerDecoderBase

    @classmethod
    def add_args(cls, parser):
        gen_parser_from_dataclass(parser, cls.config(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        cls.base_preset(args)
        cls.validate(args)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return cls.encoder_class(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return cls.decoder_class(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    @staticmethod
    def base_preset(args):
        raise NotImplementedError

    @staticmethod
    def validate(args):
        raise NotImplementedError
