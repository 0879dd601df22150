#!/usr/bin/env python
"""Training step time with the attention on the fused kernels against before.

"Before" is the unfused path, kept as the baseline: decoder self-attention with fairseq's additive
causal mask plus the target padding mask (which keeps SDPA's flash kernels out), and the last
decoder layer's cross-attention weights computed explicitly in every training forward although no
training loss reads them. "After" is the default: SDPA's own causal mask over right-padded targets
(:func:`fairseq_widearch.models.base.use_causal_kernel`) and no attention weights in training
(:class:`fairseq_widearch.models.base.AlignmentsWhenRead`). Both are switches of one model, so each
system is one model timed both ways on the same batches, alternating rounds in one process
(forward, cross-entropy, backward). Targets are padded on the right to lengths drawn between half
and all of ``--tgt-len``, as a length-bucketed batch of real text is.

The last line is one JSON object; each system's ``ratio`` = after / before seconds per training
step (below 1: faster), with both step times in ms.

``partialformer_logits_as_bias``: PartialFormer's head-scaled attention (Sec. 3.4) mixes the H_0
heads' logits through an MLP before the softmax, so SDPA cannot compute q kᵀ itself; the only fused
form left passes the finished logits (+ A^G + masks) as SDPA's additive bias over zero queries and
keys. Timed against the explicit softmax the module runs (forward + backward, attention dropout
0.1, the ``partialformer_multi30k`` decoder's H = 8 heads of d_k = 32; ratio = fused / explicit).

``kernels`` (PartialFormer systems): the whole training step with each ``PARTIALFORMER_ATTENTION_KERNEL``
(the same model, its attentions switched, alternating rounds in one process; ``auto`` is the
default), in ms and as a ratio to ``auto``: the side-by-side measurement that the utilisation
step's ratios, each against a twin timed apart, could not give (docs/records/gpu_runs.md, 2026-11-27).

    python benchmarks/fused_attention.py                       # the Multi30k presets, on the CPU
    python benchmarks/fused_attention.py --device cuda --dtype fp16 --batch-size 128 \\
        --systems multipath_transformer_6l_4p,scalable_transformer_wmt_en_de,partialformer_24_6_d360_h30_16
"""
import argparse
import json
from functools import partial

import torch

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.experiments.counting import alternating_rounds
from fairseq_widearch.experiments.data import random_training_batches
from fairseq_widearch.experiments.settings import multi30k_presets
from fairseq_widearch.model_builder import build_model
from fairseq_widearch.models.base import use_causal_kernel
from fairseq_widearch.modules.attention_utils import bias_attention, softmax_attention
from fairseq_widearch.modules.partial_attention import KERNELS, PartialAttention
from on_device import add_arguments, check, clock, describe, to, training_loss

SYSTEMS = tuple(multi30k_presets())
PAD = 1


def right_padded(batches, seed: int = 0):
    """The batches with each target (and its prefix) cut to a length in [tgt_len / 2, tgt_len],
    padded on the right."""
    g = torch.Generator().manual_seed(seed)
    for src, lengths, prev, target in batches:
        tgt_len = prev.size(1)
        keep = torch.randint(tgt_len // 2, tgt_len + 1, (prev.size(0), 1), generator=g)
        pad = torch.arange(tgt_len)[None] >= keep
        yield src, lengths, prev.masked_fill(pad, PAD), target.masked_fill(pad, PAD)


def set_mode(model, fused: bool):
    use_causal_kernel(model.decoder, fused)
    model.decoder.alignments_in_training = not fused


def train_in_mode(model, batches, fused: bool):
    set_mode(model, fused)
    for batch in batches:
        model.zero_grad(set_to_none=True)
        training_loss(model, batch).backward()


def compare(system: str, batches, args) -> dict:
    model = to(build_model(system, vocab_size=args.vocab), args).train()
    for fused in (False, True):  # warm-up: allocations, kernel loading and selection
        train_in_mode(model, batches[:1], fused)
    modes = {"before": partial(train_in_mode, model, batches, False), "after": partial(train_in_mode, model, batches, True)}
    seconds = alternating_rounds(modes, args.rounds, lambda: clock(args))
    steps = args.rounds * len(batches)
    return {"before_ms": round(1e3 * seconds["before"] / steps, 2), "after_ms": round(1e3 * seconds["after"] / steps, 2),
            "ratio": round(seconds["after"] / seconds["before"], 3)}


def set_kernel(model, kernel: str):
    for module in model.modules():
        if isinstance(module, PartialAttention):
            module.kernel = kernel


def kernel_times(system: str, batches, args) -> dict:
    """ms per training step (the default causal kernel) with each PartialFormer attention kernel."""
    model = to(build_model(system, vocab_size=args.vocab), args).train()
    set_mode(model, True)

    def train_with(kernel):
        set_kernel(model, kernel)
        train_in_mode(model, batches, True)

    runs = {kernel: partial(train_with, kernel) for kernel in KERNELS}
    alternating_rounds(runs, 1)  # warms up
    seconds = alternating_rounds(runs, args.rounds, lambda: clock(args))
    steps = args.rounds * len(batches)
    return {**{f"{k}_ms": round(1e3 * seconds[k] / steps, 2) for k in KERNELS},
            **{f"{k}/auto": round(seconds[k] / seconds["auto"], 3) for k in KERNELS if k != "auto"}}


def logits_as_bias(args, heads: int = 8, head_dim: int = 32, dropout: float = 0.1) -> dict:
    """Seconds of softmax(L) v, forward and backward, explicit against SDPA with L as the bias."""
    g = torch.Generator().manual_seed(0)
    shape = (args.batch_size, heads, args.tgt_len)
    logits = to(torch.randn(*shape, args.tgt_len, generator=g), args).requires_grad_()
    v = to(torch.randn(*shape, head_dim, generator=g), args).requires_grad_()
    forms = {"explicit": lambda: softmax_attention(logits, v, dropout)[0],
             "fused": lambda: bias_attention(logits, v, dropout)}

    def steps(form):
        for _ in range(10 * args.steps):
            form().sum().backward()

    runs = {name: partial(steps, form) for name, form in forms.items()}
    alternating_rounds(runs, 1)  # warms up
    seconds = alternating_rounds(runs, args.rounds, lambda: clock(args))
    return {"explicit_ms": round(1e3 * seconds["explicit"] / (10 * args.steps * args.rounds), 3),
            "fused_ms": round(1e3 * seconds["fused"] / (10 * args.steps * args.rounds), 3),
            "ratio": round(seconds["fused"] / seconds["explicit"], 3)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated arch presets")
    p.add_argument("--vocab", type=int, default=10000, help="joined vocabulary")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--tgt-len", type=int, default=20)
    p.add_argument("--steps", type=int, default=4, help="training steps per mode per round")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds")
    add_arguments(p)
    args = p.parse_args(argv)
    check(p, args)
    torch.manual_seed(0)
    batches = to(list(right_padded(random_training_batches(args.steps, args.batch_size, args.src_len, args.tgt_len,
                                                           args.vocab))), args)
    results = {}
    for system in args.systems.split(","):
        results[system] = res = compare(system, batches, args)
        print(f"{system:>36}: before {res['before_ms']} ms/step, after {res['after_ms']} ms/step, "
              f"after/before {res['ratio']}", flush=True)
    kernels = {system: kernel_times(system, batches, args) for system in args.systems.split(",")
               if system.startswith("partialformer")}
    for system, res in kernels.items():
        print(f"{system:>36}: PartialFormer kernels, ms/step {res}", flush=True)
    bias = logits_as_bias(args)
    print(f"PartialFormer head-scaled attention, logits as SDPA's bias / explicit: {bias['ratio']}")
    print(json.dumps({**describe(args), "batch_size": args.batch_size, "src_len": args.src_len,
                      "tgt_len": args.tgt_len, **results, "kernels": kernels, "partialformer_logits_as_bias": bias}))


if __name__ == "__main__":
    main()
