#!/usr/bin/env python
"""Training model-FLOPs utilisation (MFU) of each architecture against the stock Transformer's at
equal FLOPs.

Each system is an architecture's paper-size preset. Its stock twin is fairseq's pre-norm
Transformer of the same width (d, FFN width, heads; :func:`stock_flags`) and decoder depth, given the number of encoder layers
whose training FLOPs per batch come closest to the system's (FLOPs grow linearly with the encoder
depth: measured at 1 and 2 layers). System and twin train on the same random batches (forward,
cross-entropy, backward, Adam), alternating rounds in one process. MFU = training FLOPs per step
(matmuls of forward and backward, counted by ``torch.utils.flop_counter`` on one step; a routed or
gated model counts what it computes) × steps per second / the device's matmul peak in the same
dtype (``fairseq_widearch.experiments.counting.matmul_peak_flops``). A scalable model trains as its widest
sub-Transformer. The last line is one JSON object; each system's ``ratio`` = its MFU / its twin's
(1.0: the design keeps the device as busy as the Transformer does).

    python benchmarks/training_utilisation.py --device cuda --dtype fp16     # paper sizes, on a GPU
    python benchmarks/training_utilisation.py --systems multipath_transformer_tiny --vocab 1000 --batch-size 8
    python benchmarks/training_utilisation.py --systems "widenet_wmt_en_de;widenet_wmt_en_de:--moe-top-k=1"
"""
import argparse
import json
from functools import partial

import torch
from torch.utils.flop_counter import FlopCounterMode

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.experiments.counting import alternating_rounds, matmul_peak_flops, param_counts
from fairseq_widearch.experiments.data import random_training_batches
from fairseq_widearch.experiments.settings import paper_presets
from fairseq_widearch.model_builder import build_model, parse_arch_args
from on_device import DTYPES, add_arguments, check, clock, describe, to, training_loss

#: Every architecture at its paper's size.
SYSTEMS = tuple(paper_presets().values())


def parse_system(system: str):
    """``arch`` or ``arch:--flag=value,...`` (a candidate of the arch) -> (arch, [--flag, value, ...])."""
    arch, _, rest = system.partition(":")
    return arch, [part for item in rest.split(",") if item for part in item.split("=", 1)]


def stock_flags(system: str, encoder_layers: int) -> list:
    """The stock pre-norm Transformer of ``system``'s width d, FFN width, heads, decoder depth and
    dropouts (all three: SDPA with attention dropout takes another kernel; WideNet's experts' activation
    dropout as the twin's); FFN 4·d for PartialFormer,
    whose own FFN flag does not describe its PG-FFN (latent depth's FFN is 2·d, the others' 4·d)."""
    arch = parse_system(system)[0]
    a = parse_arch_args(arch)
    ffn = 4 * a.encoder_embed_dim if arch.startswith("partialformer") else a.encoder_ffn_embed_dim
    expert_rate = getattr(a, "moe_activation_dropout", None)  # WideNet's FFNs are its experts
    return ["--encoder-embed-dim", str(a.encoder_embed_dim), "--encoder-ffn-embed-dim", str(ffn),
            "--encoder-attention-heads", str(a.encoder_attention_heads), "--decoder-layers", str(a.decoder_layers),
            "--decoder-attention-heads", str(a.decoder_attention_heads), "--encoder-layers", str(encoder_layers),
            "--share-all-embeddings", "--encoder-normalize-before", "--decoder-normalize-before",
            "--dropout", str(a.dropout), "--attention-dropout", str(a.attention_dropout),
            "--activation-dropout", str(expert_rate if expert_rate is not None else a.activation_dropout)]


def step_flops(model, batch) -> float:
    counter = FlopCounterMode(display=False)
    with counter:
        training_loss(model, batch).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def train_steps(model, optimizer, batches):
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        training_loss(model, batch).backward()
        optimizer.step()


def twin_layers(system: str, flops: float, batch, args) -> int:
    """Encoder layers of the stock twin whose training FLOPs per step come closest to ``flops``."""
    one, two = (step_flops(to(build_model("transformer", stock_flags(system, n), vocab_size=args.vocab), args).train(),
                           batch) for n in (1, 2))
    return max(1, round((flops - one) / (two - one)) + 1)


def compare(system: str, batches, peak: float, args) -> dict:
    """MFU of ``system`` and of its stock twin, trained alternately."""
    arch, flags = parse_system(system)
    model = to(build_model(arch, flags, vocab_size=args.vocab), args).train()
    flops = step_flops(model, batches[0])
    layers = twin_layers(system, flops, batches[0], args)
    models = {system: model,
              "transformer": to(build_model("transformer", stock_flags(system, layers), vocab_size=args.vocab), args)}
    result = {name: {"params": param_counts(m)["params"], "train_gflops_per_step": step_flops(m.train(), batches[0]) / 1e9}
              for name, m in models.items()}
    result["transformer"]["encoder_layers"] = layers
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-4) for name, m in models.items()}
    for name, m in models.items():  # warm-up: allocations, kernel loading and selection
        train_steps(m, optimizers[name], batches[:1])
    runs = {name: partial(train_steps, m, optimizers[name], batches) for name, m in models.items()}
    seconds = alternating_rounds(runs, args.rounds, lambda: clock(args))
    steps = args.rounds * len(batches)
    mfu = {name: res["train_gflops_per_step"] * 1e9 * steps / seconds[name] / peak for name, res in result.items()}
    for name, res in result.items():
        res["steps_per_s"] = round(steps / seconds[name], 3)
        res["mfu"] = round(mfu[name], 4)
        res["train_gflops_per_step"] = round(res["train_gflops_per_step"], 2)
    return {**result, "ratio": round(mfu[system] / mfu["transformer"], 3)}  # unrounded: tiny models' MFU rounds to 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=";".join(SYSTEMS),
                   help="semicolon-separated arch presets, or arch:--flag=value,... for a candidate")
    p.add_argument("--vocab", type=int, default=32000, help="joined vocabulary (WMT-sized BPE)")
    p.add_argument("--batch-size", type=int, default=128, help="sentences per batch")
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=30)
    p.add_argument("--steps", type=int, default=5, help="updates per model per round")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds")
    add_arguments(p)
    args = p.parse_args(argv)
    check(p, args)
    torch.manual_seed(0)
    # on a CPU without native bf16/fp16 matmuls a 2048 product in those types takes seconds: 512 there
    cpu_n = 2048 if DTYPES[args.dtype] == torch.float32 else 512
    peak = matmul_peak_flops(args.device, DTYPES[args.dtype], n=8192 if args.device == "cuda" else cpu_n)
    batches = to(random_training_batches(args.steps, args.batch_size, args.src_len, args.tgt_len, args.vocab), args)
    results = {}
    for system in args.systems.split(";"):
        results[system] = res = compare(system, batches, peak, args)
        twin = res["transformer"]
        print(f"{system:>36}: MFU {res[system]['mfu']:.3f} ({res[system]['train_gflops_per_step']} GFLOP/step)  "
              f"stock {twin['encoder_layers']}-layer encoder: MFU {twin['mfu']:.3f} "
              f"({twin['train_gflops_per_step']} GFLOP/step)  ratio {res['ratio']}")
    print(json.dumps({**describe(args), "matmul_peak_tflops": round(peak / 1e12, 2), "batch_size": args.batch_size,
                      "src_len": args.src_len, "tgt_len": args.tgt_len, **results}))


if __name__ == "__main__":
    main()
