#!/usr/bin/env python
"""A wide architecture against the stock pre-norm Transformer of the comparison (docs/results.md):
scale at initialisation, and training loss after the same number of updates.

``--system``: one of the comparison's systems (``fairseq_widearch.experiments.compare.SYSTEMS``:
``partialformer``, ``widenet``, ``multipath_transformer``, ``latent_depth_transformer``,
``scalable_transformer``), built with its flags there. Init-time scales (one forward/backward on
the first ``--sentences`` Multi30k val sentences, train mode, dropout 0):

- each sub-layer's output RMS: what it adds to the residual stream, before dropout (the
  Transformer's attention and FFN, PartialFormer's AFFN sub-layers, WideNet's MoE, the scalable
  model's widest sub-Transformer, latent depth's before its z_l, multi-path's fused paths, Eq. 4's
  Σ α PathNorm(f_i)); a module shared across blocks is measured at every block it serves;
- each block's output RMS, what the whole block adds to the residual stream (its output minus its
  input: latent depth's scaled by the z_l sampled at initialisation); pre-norm blocks only, as a
  post-norm block's output is normalised (the scalable model's);
- the residual stream's RMS at the encoder's output, and the gradient norm of the encoder's
  non-embedding parameters.

Then both train ``--updates`` updates with the comparison's settings (Adam (0.9, 0.98), lr 0.003,
inverse sqrt with 300 warm-up updates, dropout, attention and activation dropout 0.1, label smoothing
0.1, 4,096 tokens per batch, seed ``--seed``; each system's criterion and task, the scalable model's
stage 1) through ``fairseq-train``, and the training loss (base 2, as fairseq logs it) over the last
50 updates is printed. The last line is one JSON object (per system: the ranges of the sub-layer and
block output RMS, the residual stream's, the gradient norm, the training loss); ``ratio`` = the
system's loss minus the Transformer's (target <= 0.2). ``--updates 0`` measures the init-time
scales alone.

    python benchmarks/init_scale.py --data DATA_BIN [--system partialformer|widenet|...] [--updates 450]
        [--seed 1] [--flags "..."]

``DATA_BIN``: a binarized Multi30k En-De (``examples/multi30k/prepare.py``); ``--flags``: extra
flags of the system (e.g. ``--partialformer-init ours``, ``--widenet-experts ours``).
"""
import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
from fairseq.data import Dictionary, data_utils

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.experiments.compare import SYSTEMS
from fairseq_widearch.experiments.settings import OPTIMISATION, criterion_flags
from fairseq_widearch.model_builder import build_model

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["--cpu", "--num-workers", "0", *OPTIMISATION, "--log-format", "simple", "--log-interval", "1", "--no-save",
         "--disable-validation"]
SUBLAYERS = ("self_attn", "encoder_attn", "fc2", "ffn", "moe")
#: A hook's view of a call: (module, positional inputs, keyword inputs, output) -> what it adds.
Added = Callable[[torch.nn.Module, tuple, dict, object], torch.Tensor]


def validation_batch(data: Path, dictionary: Dictionary, sentences: int):
    """The first ``sentences`` pairs of Multi30k val as one padded batch (fairseq's layout)."""
    pairs = [data_utils.load_indexed_dataset(str(data / f"valid.en-de.{lang}"), dictionary) for lang in ("en", "de")]
    src = [pairs[0][i] for i in range(sentences)]
    tgt = [pairs[1][i] for i in range(sentences)]
    pad, eos = dictionary.pad(), dictionary.eos()
    return {"src_tokens": data_utils.collate_tokens(src, pad, eos, left_pad=True),
            "src_lengths": torch.tensor([len(s) for s in src]),
            "prev_output_tokens": data_utils.collate_tokens(tgt, pad, eos, left_pad=False, move_eos_to_beginning=True),
            "target": data_utils.collate_tokens(tgt, pad, eos, left_pad=False)}


def first(output) -> torch.Tensor:
    """A module's hidden output: the tensor, or the first of its tuple."""
    return output[0] if isinstance(output, tuple) else output


def sublayer_output(module, args, kwargs, output) -> torch.Tensor:
    """A sub-layer's addition: its output (before the block's dropout)."""
    return first(output)


def fused_paths(fusion, args, kwargs, output) -> torch.Tensor:
    """A multi-path sub-layer's addition: Y − β X (Eq. 4), from its fusion's call (X, paths)."""
    return output - fusion.beta * args[0]


def block_output(layer, args, kwargs, output) -> torch.Tensor:
    """A pre-norm block's addition: its output minus its input."""
    return first(output) - (args[0] if args else kwargs["x"])


def hooked_modules(model) -> Dict[torch.nn.Module, tuple]:
    """Each module to measure -> (``"sublayer"`` or ``"block"``; its names, one per call in call
    order, as a module shared across blocks serves several; what it adds to the residual stream).
    Sub-layers are named ``{stack}.{block}.{sub-layer}`` (a multi-path sub-layer measured at its
    fusion), pre-norm blocks ``{stack}.{block}``."""
    modules: Dict[torch.nn.Module, tuple] = {}

    def add(module, part: str, name: str, added: Added):
        modules.setdefault(module, (part, [], added))[1].append(name)

    for stack in ("encoder", "decoder"):
        for i, layer in enumerate(getattr(model, stack).layers):
            for name in SUBLAYERS:
                sublayer = getattr(layer, name, None)
                if isinstance(sublayer, torch.nn.Module):
                    fusion = getattr(sublayer, "fusion", None)
                    add(fusion or sublayer, "sublayer", f"{stack}.{i}.{name}",
                        fused_paths if fusion else sublayer_output)
            if getattr(layer, "normalize_before", True):  # multi-path layers are pre-norm throughout
                add(layer, "block", f"{stack}.{i}", block_output)
    return modules


def rms(t: torch.Tensor, mask: torch.Tensor) -> float:
    """RMS over the non-padding positions; t ``(T, B, C)``, mask ``(B, T)`` True at padding."""
    return t.float().pow(2).mean(-1).transpose(0, 1)[~mask].mean().sqrt().item()


def init_scales(flags: List[str], batch, dictionary: Dictionary, seed: int = 1) -> dict:
    """Sub-layer and block output RMS, residual stream RMS and the encoder's non-embedding gradient
    norm of the system trained with ``flags`` (its arch's own flags build it; task and criterion
    flags are training's)."""
    torch.manual_seed(seed)
    arch = flags[flags.index("--arch") + 1]
    model = build_model(arch, [*flags, "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"],
                        src_dict=dictionary, known_only=True).train()
    outputs: Dict[str, Dict[str, torch.Tensor]] = {"sublayer": {}, "block": {}}

    def record(part: str, names: List[str], added: Added):
        calls = iter(names)
        return lambda *call: outputs[part].__setitem__(next(calls), added(*call))

    hooks = [module.register_forward_hook(record(*measured), with_kwargs=True)
             for module, measured in hooked_modules(model).items()]
    logits, extra = model(batch["src_tokens"], batch["src_lengths"], batch["prev_output_tokens"])
    for hook in hooks:
        hook.remove()
    target = batch["target"]
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, ignore_index=dictionary.pad())
    loss.backward()
    src_pad, tgt_pad = batch["src_tokens"].eq(dictionary.pad()), target.eq(dictionary.pad())
    scales = {part: {name: rms(out, src_pad if name.startswith("encoder") else tgt_pad) for name, out in named.items()}
              for part, named in outputs.items()}
    states = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"], return_all_hiddens=True)
    encoder_grad = torch.stack([p.grad.norm() for name, p in model.encoder.named_parameters()
                                if p.grad is not None and "embed" not in name]).norm().item()
    return {"sublayer_rms": scales["sublayer"], "block_rms": scales["block"],
            "residual_rms": rms(states["encoder_states"][-1], src_pad),
            "encoder_grad_norm": encoder_grad, "loss": loss.item()}


def by_kind(scales: Dict[str, float], part: int = -1) -> Dict[str, List[float]]:
    """``{kind: [lowest, highest]}`` of the output RMS, kind = the name's ``part``: the sub-layer
    (``fc2``, ``moe``, ``self_attn``, ...) by default, the stack with ``part=0``."""
    kinds: Dict[str, List[float]] = {}
    for name, value in scales.items():
        kinds.setdefault(name.split(".")[part], []).append(value)
    return {kind: [round(min(v), 3), round(max(v), 3)] for kind, v in kinds.items()}


def value_range(scales: Dict[str, float]) -> Optional[List[float]]:
    """``[lowest, highest]`` of the output RMS, None when nothing was measured."""
    return [min(scales.values()), max(scales.values())] if scales else None


def train_loss(data: Path, flags: List[str], updates: int, seed: int, window: int = 50) -> float:
    """Training loss (base 2, as fairseq-train logs it) averaged over updates ``updates - window + 1``
    to ``updates`` (one batch alone is noisy), as ``--log-interval window`` would report it."""
    out = subprocess.run([str(Path(sys.executable).parent / "fairseq-train"), str(data), "--user-dir",
                          str(ROOT / "fairseq_widearch"), *flags, *criterion_flags(flags), *TRAIN, "--seed", str(seed),
                          "--max-update", str(updates)],
                         capture_output=True, text=True, check=True).stdout
    losses = {int(n): float(loss) for loss, n in re.findall(r"\bloss=([\d.]+),.*\bnum_updates=(\d+),", out)}
    return sum(losses[n] for n in range(updates - window + 1, updates + 1)) / window


def summary(scales: dict) -> dict:
    """One system's JSON entry: ranges in place of the per-module values."""
    return {**{k: v for k, v in scales.items() if k not in ("sublayer_rms", "block_rms")},
            "sublayer_rms_range": value_range(scales["sublayer_rms"]),
            "sublayer_rms_by_kind": by_kind(scales["sublayer_rms"]),
            "block_rms_by_stack": by_kind(scales["block_rms"], part=0)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--updates", type=int, default=450)
    parser.add_argument("--sentences", type=int, default=48)
    parser.add_argument("--system", choices=[name for name in SYSTEMS if name != "transformer"],
                        default="partialformer")
    parser.add_argument("--flags", default="", help="extra flags of the system")
    parser.add_argument("--seed", type=int, default=1, help="training seed of both systems")
    args = parser.parse_args(argv)
    dictionary = Dictionary.load(str(args.data / "dict.en.txt"))
    batch = validation_batch(args.data, dictionary, args.sentences)
    systems = {"transformer": SYSTEMS["transformer"], args.system: [*SYSTEMS[args.system], *shlex.split(args.flags)]}
    result = {}
    for name, flags in systems.items():
        scales = init_scales(flags, batch, dictionary)
        low, high = value_range(scales["sublayer_rms"])
        print(f"{name}: sub-layer output RMS {low:.3f}-{high:.3f} {by_kind(scales['sublayer_rms'])}, "
              f"block output RMS {by_kind(scales['block_rms'], part=0)}, residual stream "
              f"{scales['residual_rms']:.3f}, encoder gradient norm {scales['encoder_grad_norm']:.3f}")
        result[name] = scales
    if args.updates:
        for name, flags in systems.items():
            result[name]["train_loss"] = train_loss(args.data, flags, args.updates, args.seed)
            print(f"{name}: training loss, updates {args.updates - 49}-{args.updates}: "
                  f"{result[name]['train_loss']:.3f}")
    print(json.dumps({"benchmark": "init_scale", "system": args.system, "flags": args.flags, "seed": args.seed,
                      "updates": args.updates, **{name: summary(r) for name, r in result.items()},
                      "ratio": round(result[args.system].get("train_loss", 0)
                                     - result["transformer"].get("train_loss", 0), 3)}))


if __name__ == "__main__":
    main()
