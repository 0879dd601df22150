"""Task ``scalable_translation``: translation that trains the sub-Transformers of a
``scalable_transformer`` (Gao et al. 2021, Sec. 3.3).

Each update j trains the widest sub-Transformer T_max and m sampled ones 𝕋^(j), one forward and
one backward each, so activation memory stays that of one forward. 𝕋^(j) is drawn with an RNG
seeded by (``--seed``, j): every data-parallel rank draws the same sub-Transformers, and a
resumed run draws what the uninterrupted one would have. By default one of the m is the
narrowest (the "sandwich rule" that fits the paper's 46 GFLOPs per training forward, paper
summary decision 4), the others are random: type-1 draws one width C = D^i from M, type-2 keeps
C = M_max and draws each D^i from M. The loss of each sub-Transformer comes from the criterion
``scalable_self_distillation`` (Eqs. 6-9).

Validation and generation run the sub-Transformer ``--eval-width`` names (activated when the
model is built and before every validation step); validation also logs the loss at the
narrowest, a middle and the widest width (``loss_w<width>``).
"""
import contextlib
import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from fairseq.logging import metrics
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from ..fairseq_fixes import registered_name
from ..modules.sub_transformers import parse_widths, width_set
from ..validation import refuse

#: A sub-Transformer: C and, for type-2, D^i of every encoder then decoder layer (None: D^i = C).
SubTransformer = Tuple[int, Optional[List[int]]]


@dataclass
class ScalableTranslationConfig(TranslationConfig):
    num_sub_transformers: int = field(
        default=2, metadata={"help": "m = |𝕋^(j)|, sub-Transformers trained besides the widest in every update "
                                     "(Sec. 3.3: 'a few')"}
    )
    no_narrowest: bool = field(
        default=False, metadata={"help": "draw all m sub-Transformers at random; by default one of them is the "
                                         "narrowest (sandwich rule)"}
    )
    eval_width: str = field(
        default="", metadata={"help": "the sub-Transformer validation and generation run: C (type-1), or D^i of "
                                      "every encoder then decoder layer, comma-separated (type-2, C = M_max); "
                                      "empty: the widest"}
    )
    seed: int = II("common.seed")


def draw_sub_transformers(widths: Sequence[int], sub_type: str, widest: int, num_layers: int, m: int,
                          narrowest: bool, seed: int, update_num: int) -> List[SubTransformer]:
    """𝕋^(j) of update ``update_num``: ``m`` sub-Transformers over the width set ``widths`` (M,
    ascending), the first the narrowest if ``narrowest``; the RNG is seeded by (seed, update)."""
    rng = np.random.default_rng([seed, update_num])
    drawn: List[SubTransformer] = []
    if narrowest and m > 0:
        drawn.append((widths[0], None) if sub_type == "type1" else (widest, [widths[0]] * num_layers))
    pool = [w for w in widths[:-1] if not (narrowest and w == widths[0])] or list(widths[:-1]) or list(widths)
    while len(drawn) < m:
        if sub_type == "type1":
            drawn.append((int(rng.choice(pool)), None))
        else:
            drawn.append((widest, [int(w) for w in rng.choice(widths, size=num_layers)]))
    return drawn


def no_sync(model, skip: bool):
    """Data-parallel models: accumulate this backward's gradients locally (the last sub-Transformer's
    backward synchronises them all)."""
    return model.no_sync() if skip and hasattr(model, "no_sync") else contextlib.nullcontext()


@register_task("scalable_translation", dataclass=ScalableTranslationConfig)
class ScalableTranslationTask(TranslationTask):
    """Translation over the sub-Transformers of a scalable model (module docstring).

    Raises:
        ValueError: if the model has no sub-Transformers, ``--num-sub-transformers`` is negative,
            ``--eval-width`` is not a sub-Transformer of the model (message names the flag), or
            training runs with another criterion than ``scalable_self_distillation``.
    """

    cfg: ScalableTranslationConfig

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if not hasattr(model, "set_sample_config"):
            arch = getattr(cfg, "arch", None) or cfg._name  # (fairseq-hydra-train's model config has _name alone)
            refuse(f"--task scalable_translation needs a scalable_transformer arch, not {arch!r}")
        if self.cfg.num_sub_transformers < 0:
            refuse(f"--num-sub-transformers must be >= 0, got {self.cfg.num_sub_transformers}")
        self.eval_sub_transformer(model)
        return model

    def eval_sub_transformer(self, model):
        """Activate the ``--eval-width`` sub-Transformer."""
        if not self.cfg.eval_width:
            return model.set_sample_config(*model.widest_config())
        try:
            widths = parse_widths(self.cfg.eval_width)
            if len(widths) == 1:
                model.set_sample_config(widths[0])
            else:
                model.set_sample_config(model.widest_config()[0], widths)
        except ValueError as error:
            refuse(f"--eval-width {self.cfg.eval_width!r}: {error}")

    def sub_transformers(self, model, update_num: int) -> List[SubTransformer]:
        """The widest sub-Transformer, then 𝕋^(j)."""
        widest, dims = model.widest_config()
        drawn = draw_sub_transformers(width_set(model.cfg), model.cfg.sub_transformer_type, widest, len(dims),
                                      self.cfg.num_sub_transformers, not self.cfg.no_narrowest, self.cfg.seed,
                                      update_num)
        return [(widest, dims), *drawn]

    @staticmethod
    def criterion_error(criterion) -> Optional[str]:
        """Why ``criterion`` cannot train under this task, or None (fairseq-train asks at start-up,
        ``fairseq_fixes.training_criterion_error``)."""
        if hasattr(criterion, "sub_transformer_loss"):
            return None
        return (f"--task scalable_translation trains with --criterion scalable_self_distillation (its --distill-stage 1 "
                f"is label-smoothed CE for every sub-Transformer), not --criterion {registered_name(criterion)}")

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        error = self.criterion_error(criterion)
        if error:
            refuse(error)
        model.train()
        model.set_num_updates(update_num)
        configs = self.sub_transformers(model, update_num)
        logs, teacher = [], None
        for i, config in enumerate(configs):
            model.set_sample_config(*config)
            with no_sync(model, i < len(configs) - 1):
                with torch.autograd.profiler.record_function("forward"):
                    if i == 0:
                        loss, sample_size, log, teacher = criterion.widest_loss(model, sample, update_num)
                    else:
                        loss, log = criterion.sub_transformer_loss(model, sample, teacher, update_num)
                if ignore_grad:
                    loss *= 0
                with torch.autograd.profiler.record_function("backward"):
                    optimizer.backward(loss)
            logs.append(log)
        model.set_sample_config(*configs[0])
        # keys in the same order on every rank: fairseq's all_reduce_dict sums the values of the
        # ranks' logs position by position, and a set's order of strings differs between processes
        keys = dict.fromkeys(key for log in logs for key in log)
        summed = {key: sum(log.get(key, 0) for log in logs) for key in keys}
        return summed["loss"], sample_size, summed

    def validation_sub_transformers(self, model) -> List[Tuple[str, SubTransformer]]:
        """The narrowest, a middle and the widest width of M (type-2: D^i = that width everywhere)."""
        widths, (widest, dims) = width_set(model.cfg), model.widest_config()
        chosen = sorted({widths[0], widths[len(widths) // 2], widths[-1]})
        if model.cfg.sub_transformer_type == "type1":
            return [(f"loss_w{w}", (w, None)) for w in chosen]
        return [(f"loss_w{w}", (widest, [w] * len(dims))) for w in chosen]

    def valid_step(self, sample, model, criterion):
        model.eval()
        losses = {}
        with torch.no_grad():
            for key, config in self.validation_sub_transformers(model):
                model.set_sample_config(*config)
                losses[key] = criterion(model, sample)[2]["loss"]
        self.eval_sub_transformer(model)
        loss, sample_size, log = super().valid_step(sample, model, criterion)
        return loss, sample_size, {**log, **losses}

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        for key in sorted({k for log in logging_outputs for k in log if k.startswith("loss_w")}):
            total = sum(log.get(key, 0) for log in logging_outputs)
            metrics.log_scalar(key, float(total) / sample_size / math.log(2), sample_size, round=3)
