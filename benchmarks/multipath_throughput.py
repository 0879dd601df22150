#!/usr/bin/env python
"""Training throughput: 6-layer 4-path multi-path encoder vs the Deep-24 pre-norm Transformer.

Lin et al. 2022 (Table 2) compare them at equal parameters and FLOPs (118M at d = 512); their
Fig. 8 shows the multi-path model training *slower* than the deep one. Here both are built at a
width reduced to fit this CPU (same width, heads, FFN ratio and 6-layer decoder for both) and
trained in one process, alternating rounds of ``--steps`` updates each, on the same batches, so
machine noise hits both alike. Prints tokens/s of each and their ratio; the last line is one JSON
object with the figures and ``ratio`` = multi-path tokens/s / deep tokens/s (target >= 1.0).

The measurement runs twice, each in a fresh process (see ``malloc_modes.py``): with glibc's
default malloc (``ratio_default_malloc``) and with freed memory reused (``ratio``).

On a GPU (``--device cuda``, one run: the malloc settings concern host memory), at the paper's
size and precision: ``--device cuda --dtype fp16 --dim 512 --heads 8 --batch-size 200 --src-len 20
--tgt-len 20`` (8,000 tokens a batch).

    python benchmarks/multipath_throughput.py [--dim 128] [--rounds 5] [--steps 5] [--device cpu|cuda]
        [--dtype fp32|fp16|bf16]
"""
import argparse
import json
import sys
from functools import partial

import torch

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.experiments.counting import alternating_rounds, count_macs, param_counts
from fairseq_widearch.experiments.data import random_training_batches
from fairseq_widearch.model_builder import build_model
from malloc_modes import both_modes
from on_device import add_arguments, check, clock, describe, to

#: Both models' dropouts: the multi-path presets' (residual, attention and activation 0.1, the deep
#: pre-norm recipe the paper follows), given to the deep twin too, whose fairseq defaults for
#: attention and activation dropout are 0 (equal settings: each dropout costs its own kernels).
DROPOUTS = {"dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.1}


def width_flags(dim, heads):
    return ["--encoder-embed-dim", str(dim), "--decoder-embed-dim", str(dim),
            "--encoder-ffn-embed-dim", str(4 * dim), "--decoder-ffn-embed-dim", str(4 * dim),
            "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads),
            *[part for name, p in DROPOUTS.items() for part in (f"--{name.replace('_', '-')}", str(p))],
            "--share-all-embeddings"]


def models(dim, heads, vocab):
    common = width_flags(dim, heads)
    return {
        "multipath_6l_4p": build_model("multipath_transformer_6l_4p", common, vocab_size=vocab),
        "deep24": build_model("transformer", common + ["--encoder-layers", "24", "--encoder-normalize-before",
                                                       "--decoder-normalize-before"], vocab_size=vocab),
    }


def train_steps(model, optimizer, batches):
    """One optimizer update per batch (forward, cross-entropy, backward, Adam)."""
    for src, lengths, prev, target in batches:
        optimizer.zero_grad(set_to_none=True)
        logits, _ = model(src, lengths, prev)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), target.view(-1))
        loss.backward()
        optimizer.step()


def measure(args):
    """Train both models alternately in this process; return the figures as a dict."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ms = models(args.dim, args.heads, args.vocab)
    stats = {name: {**param_counts(m), "macs": count_macs(m, args.src_len, args.tgt_len)} for name, m in ms.items()}
    ms = {name: to(m, args).train() for name, m in ms.items()}
    opts = {name: torch.optim.Adam(m.parameters(), lr=1e-4) for name, m in ms.items()}
    batches = to(random_training_batches(args.steps, args.batch_size, args.src_len, args.tgt_len, args.vocab), args)
    tokens_per_round = args.steps * args.batch_size * (args.src_len + args.tgt_len)

    for name in ms:  # warm-up (allocator, kernels) outside the measurement
        train_steps(ms[name], opts[name], batches[:1])
    seconds = alternating_rounds({name: partial(train_steps, ms[name], opts[name], batches) for name in ms},
                                 args.rounds, lambda: clock(args))
    result = {}
    for name in ms:
        result[name] = {"tokens_per_s": round(args.rounds * tokens_per_round / seconds[name], 1), **stats[name]}
    result["ratio"] = round(result["multipath_6l_4p"]["tokens_per_s"] / result["deep24"]["tokens_per_s"], 3)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=128, help="model width d (paper: 512)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8000, help="joined vocabulary (Multi30k-sized BPE)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--tgt-len", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    p.add_argument("--steps", type=int, default=5, help="updates per model per round")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    add_arguments(p)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    check(p, args)
    if args.child:
        print(json.dumps(measure(args)))
        return
    print(f"-- both models: dropout {DROPOUTS['dropout']}, attention dropout {DROPOUTS['attention_dropout']}, "
          f"activation dropout {DROPOUTS['activation_dropout']}")
    if args.device == "cuda":  # glibc's malloc holds no GPU memory: one run
        res = measure(args)
        report("cuda", res)
        print(json.dumps({"dim": args.dim, "rounds": args.rounds, "steps": args.steps, "dropouts": DROPOUTS,
                          **describe(args), **res}))
        return
    default, reuse = both_modes(__file__, argv if argv is not None else sys.argv[1:])
    for label, res in (("glibc default malloc", default), ("freed memory reused", reuse)):
        report(label, res)
    summary = {"dim": args.dim, "threads": torch.get_num_threads(), "rounds": args.rounds, "steps": args.steps,
               "dropouts": DROPOUTS,
               **describe(args), **reuse, "ratio_default_malloc": default["ratio"], "default_malloc": default}
    print(json.dumps(summary))


def report(label, res):
    """The human-readable lines of one measurement."""
    print(f"-- {label}")
    for name in ("multipath_6l_4p", "deep24"):
        r = res[name]
        print(f"{name:>16}: {r['tokens_per_s']:9.1f} tokens/s  params {r['params'] / 1e6:.2f}M  "
              f"MACs(20+20) {r['macs'] / 1e6:.1f}M")
    print(f"ratio multipath/deep = {res['ratio']}")


if __name__ == "__main__":
    main()
