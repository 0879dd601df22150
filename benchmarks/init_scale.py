#!/usr/bin/env python
"""A wide architecture against the stock pre-norm Transformer of the comparison (docs/results.md):
scale at initialisation, and training loss after the same number of updates.

``--system``: ``partialformer`` (``partialformer_multi30k``) or ``widenet`` (``widenet_multi30k``,
λ = 0.01 as in the comparison). Init-time scales (one forward/backward on the first ``--sentences``
Multi30k val sentences, train mode, dropout 0): each sub-layer's output RMS (PartialFormer's AFFN
sub-layers, WideNet's attention and MoE sub-layers, the Transformer's attention and FFN sub-layers;
a module shared across blocks is measured at every block it serves) against the residual stream's,
and the gradient norm of the encoder's non-embedding parameters. Then both train ``--updates``
updates with the comparison's settings (Adam (0.9, 0.98), lr 0.003, inverse sqrt with 300 warm-up
updates, dropout, attention and activation dropout 0.1, label smoothing 0.1, 4,096 tokens per batch,
seed ``--seed``; each system's criterion) through ``fairseq-train``, and the training loss (base 2,
as fairseq logs it) over the last 50 updates is printed. The last line is one JSON object (per
system: the range of the sub-layer output RMS, the residual stream's, the gradient norm, the
training loss); ``ratio`` = the system's loss minus the Transformer's (target <= 0.2).
``--updates 0`` measures the init-time scales alone.

    python benchmarks/init_scale.py --data DATA_BIN [--system partialformer|widenet] [--updates 450] [--seed 1]
        [--flags "..."]

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
from typing import Dict, List

import torch

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq.data import Dictionary, data_utils
from fairseq_widearch.model_builder import build_model

from fairseq_widearch.experiments.settings import BODY, OPTIMISATION, PRE_NORM, criterion_flags

ROOT = Path(__file__).resolve().parents[1]
TRANSFORMER = [*BODY, "--encoder-layers", "4", "--decoder-layers", "4", *PRE_NORM]
SYSTEMS = {"transformer": ("transformer", TRANSFORMER), "partialformer": ("partialformer_multi30k", []),
           "widenet": ("widenet_multi30k", [])}  # the criterion's λ = 0.01, as the comparison
TRAIN = ["--cpu", "--num-workers", "0", *OPTIMISATION, "--log-format", "simple", "--log-interval", "1", "--no-save",
         "--disable-validation"]


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


def sublayer_modules(model) -> Dict[torch.nn.Module, List[str]]:
    """Each module whose output is added to the residual stream (before dropout) -> its names, one
    per block it serves, in the order of its calls (a module shared across blocks serves several)."""
    modules: Dict[torch.nn.Module, List[str]] = {}
    for stack in ("encoder", "decoder"):
        for i, layer in enumerate(getattr(model, stack).layers):
            for name in ("self_attn", "encoder_attn", "fc2", "moe"):
                if getattr(layer, name, None) is not None:
                    modules.setdefault(getattr(layer, name), []).append(f"{stack}.{i}.{name}")
    return modules


def rms(t: torch.Tensor, mask: torch.Tensor) -> float:
    """RMS over the non-padding positions; t ``(T, B, C)``, mask ``(B, T)`` True at padding."""
    return t.float().pow(2).mean(-1).transpose(0, 1)[~mask].mean().sqrt().item()


def init_scales(arch: str, argv: List[str], batch, dictionary: Dictionary, seed: int = 1) -> dict:
    """Sub-layer output RMS, residual stream RMS and the encoder's non-embedding gradient norm."""
    torch.manual_seed(seed)
    model = build_model(arch, [*argv, "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"],
                        src_dict=dictionary).train()
    outputs: Dict[str, torch.Tensor] = {}

    def record(names: List[str]):
        calls = iter(names)
        return lambda module, inputs, out: outputs.__setitem__(next(calls), out[0] if isinstance(out, tuple) else out)

    hooks = [module.register_forward_hook(record(names)) for module, names in sublayer_modules(model).items()]
    logits, extra = model(batch["src_tokens"], batch["src_lengths"], batch["prev_output_tokens"])
    for hook in hooks:
        hook.remove()
    target = batch["target"]
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, ignore_index=dictionary.pad())
    loss.backward()
    src_pad, tgt_pad = batch["src_tokens"].eq(dictionary.pad()), target.eq(dictionary.pad())
    sublayers = {name: rms(out, src_pad if name.startswith("encoder") else tgt_pad) for name, out in outputs.items()}
    states = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"], return_all_hiddens=True)
    encoder_grad = torch.stack([p.grad.norm() for name, p in model.encoder.named_parameters()
                                if p.grad is not None and "embed" not in name]).norm().item()
    return {"sublayer_rms": sublayers, "residual_rms": rms(states["encoder_states"][-1], src_pad),
            "encoder_grad_norm": encoder_grad, "loss": loss.item()}


def by_kind(sublayer_rms: Dict[str, float]) -> Dict[str, List[float]]:
    """``{kind: [lowest, highest]}`` of the sub-layer output RMS, kind = the sub-layer's name (``fc2``,
    ``moe``, ``self_attn``, ...) without its stack and block."""
    kinds: Dict[str, List[float]] = {}
    for name, value in sublayer_rms.items():
        kinds.setdefault(name.rsplit(".", 1)[1], []).append(value)
    return {kind: [round(min(v), 3), round(max(v), 3)] for kind, v in kinds.items()}


def train_loss(data: Path, arch: str, argv: List[str], updates: int, seed: int, window: int = 50) -> float:
    """Training loss (base 2, as fairseq-train logs it) averaged over updates ``updates - window + 1``
    to ``updates`` (one batch alone is noisy), as ``--log-interval window`` would report it."""
    flags = ["--arch", arch, *argv]
    out = subprocess.run([str(Path(sys.executable).parent / "fairseq-train"), str(data), "--user-dir",
                          str(ROOT / "fairseq_widearch"), *flags, *criterion_flags(flags), *TRAIN, "--seed", str(seed),
                          "--max-update", str(updates)],
                         capture_output=True, text=True, check=True).stdout
    losses = {int(n): float(loss) for loss, n in re.findall(r"\bloss=([\d.]+),.*\bnum_updates=(\d+),", out)}
    return sum(losses[n] for n in range(updates - window + 1, updates + 1)) / window


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--updates", type=int, default=450)
    parser.add_argument("--sentences", type=int, default=48)
    parser.add_argument("--system", choices=("partialformer", "widenet"), default="partialformer")
    parser.add_argument("--flags", default="", help="extra flags of the system")
    parser.add_argument("--seed", type=int, default=1, help="training seed of both systems")
    args = parser.parse_args()
    dictionary = Dictionary.load(str(args.data / "dict.en.txt"))
    batch = validation_batch(args.data, dictionary, args.sentences)
    systems = {name: (arch, argv + (shlex.split(args.flags) if name == args.system else []))
               for name, (arch, argv) in SYSTEMS.items() if name in ("transformer", args.system)}
    result = {}
    for name, (arch, argv) in systems.items():
        scales = init_scales(arch, argv, batch, dictionary)
        values = list(scales["sublayer_rms"].values())
        print(f"{name}: sub-layer output RMS {min(values):.3f}-{max(values):.3f} {by_kind(scales['sublayer_rms'])}, "
              f"residual stream "
              f"{scales['residual_rms']:.3f}, encoder gradient norm {scales['encoder_grad_norm']:.3f}")
        result[name] = scales
    if args.updates:
        for name, (arch, argv) in systems.items():
            result[name]["train_loss"] = train_loss(args.data, arch, argv, args.updates, args.seed)
            print(f"{name}: training loss, updates {args.updates - 49}-{args.updates}: "
                  f"{result[name]['train_loss']:.3f}")
    print(json.dumps({"benchmark": "init_scale", "system": args.system, "flags": args.flags, "seed": args.seed,
                      "updates": args.updates,
                      **{name: {**{k: v for k, v in r.items() if k != "sublayer_rms"},
                                "sublayer_rms_range": [min(r["sublayer_rms"].values()), max(r["sublayer_rms"].values())],
                                "sublayer_rms_by_kind": by_kind(r["sublayer_rms"])}
                         for name, r in result.items()},
                      "ratio": round(result[args.system].get("train_loss", 0)
                                     - result["transformer"].get("train_loss", 0), 3)}))


if __name__ == "__main__":
    main()
