"""The widths of a scalable Transformer's sub-Transformers (Gao et al. 2021, Secs. 3.1-3.3, Appendix B):
the width set M, the widths a model is built at, width-dependent dropout, and the top-left weight
blocks a sub-Transformer of width C uses. Shared by the model (``..models.scalable_transformer``),
the task that trains the sub-Transformers (``..tasks.scalable_translation``) and the tools."""
from typing import Dict, List, Tuple

from torch import Tensor

from .slimmable import HEAD_DIM


def parse_widths(text: str) -> List[int]:
    """``'256,320'`` -> ``[256, 320]``."""
    return [int(w) for w in str(text).split(",")]


def width_set(cfg) -> List[int]:
    """M, ascending (as ``--scalable-widths`` must list it)."""
    if cfg.scalable_widths:
        return parse_widths(cfg.scalable_widths)
    return list(range(cfg.encoder_embed_dim // 4, cfg.encoder_embed_dim + 1, HEAD_DIM))


def built_widths(cfg) -> Tuple[int, List[int]]:
    """C and D^1..D^L (encoder then decoder layers) the model is built at: the widest model's
    (M_max everywhere), or an exported sub-Transformer's."""
    width = cfg.exported_width or cfg.encoder_embed_dim
    num_layers = cfg.encoder_layers + cfg.decoder_layers
    dims = parse_widths(cfg.exported_layer_widths) if cfg.exported_layer_widths else [width] * num_layers
    return width, dims


def crop_linear(prefix: str, linear, out_features: int, in_features: int, full_bias: bool = False) -> Dict[str, Tensor]:
    """The top-left ``(out, in)`` block of a linear layer's weight and its bias (first ``out``
    entries, or all of them for an output kept at full width, Eq. 5)."""
    cropped = {f"{prefix}.weight": linear.weight[:out_features, :in_features]}
    if linear.bias is not None:
        cropped[f"{prefix}.bias"] = linear.bias if full_bias else linear.bias[:out_features]
    return cropped


def crop_norm(prefix: str, norm, width: int) -> Dict[str, Tensor]:
    return {f"{prefix}.weight": norm.weight[:width], f"{prefix}.bias": norm.bias[:width]}


def width_dropout(cfg, width: int) -> float:
    """The dropout of sub-Transformers of width ``width`` (Appendix B; Tables 1 and 8)."""
    table = sorted((int(w), float(p)) for w, p in (item.split(":") for item in cfg.width_dropout.split(",")))
    chosen = [p for w, p in table if width >= w]
    return chosen[-1] if chosen else table[0][1]
