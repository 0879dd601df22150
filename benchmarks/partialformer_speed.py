#!/usr/bin/env python
"""Beam-search decoding throughput: PartialFormer 24-6/d360/H30-16 vs the Transformer 24-6/d360
(Table 5 rows 4 and 2; 68M vs 62M parameters).

Both models are built at the paper's size (vocabulary 34,040 shared), randomly initialised, and
decode the same random source batches with fairseq's ``SequenceGenerator`` (beam 4, exactly
``--tgt-len`` target tokens each so both do the same number of steps), alternating rounds in one
process so machine noise hits both alike. The MACs of the same decoding (encoder + cached
incremental decoder steps + output projections, beams included) are measured with
``torch.utils.flop_counter``. The last output line is one JSON object with both throughputs
(sentences/s, target tokens/s), ``ratio`` = PartialFormer / Transformer throughput and
``macs_ratio`` = Transformer MACs / PartialFormer MACs: if decoding speed followed the work done,
the two would be equal (target: ``ratio`` within 10% of ``macs_ratio``).

On a GPU: ``--device cuda --dtype fp16 --batch-size 128`` (fairseq-generate's batch).

    python benchmarks/partialformer_speed.py [--batch-size 16] [--rounds 3] [--batches 2] [--device cpu|cuda]
        [--dtype fp32|fp16|bf16]
"""
import argparse
import json
from functools import partial

import torch
from fairseq.sequence_generator import SequenceGenerator
from torch.utils.flop_counter import FlopCounterMode

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.experiments.counting import alternating_rounds, param_counts
from fairseq_widearch.experiments.data import random_source_batches
from fairseq_widearch.model_builder import build_model
from on_device import add_arguments, check, clock, describe, to

TRANSFORMER_24_6_D360 = ["--encoder-layers", "24", "--encoder-embed-dim", "360", "--encoder-ffn-embed-dim", "1440",
                         "--share-all-embeddings", "--encoder-normalize-before", "--decoder-normalize-before"]


def models(vocab):
    return {"partialformer_24_6_d360_h30_16": build_model("partialformer_24_6_d360_h30_16", vocab_size=vocab).eval(),
            "transformer_24_6_d360": build_model("transformer", TRANSFORMER_24_6_D360, vocab_size=vocab).eval()}


def generator(model, args):
    return SequenceGenerator([model], model.decoder.dictionary, beam_size=args.beam, max_len_a=0,
                             max_len_b=args.tgt_len, min_len=args.tgt_len)


def decode(gen, batches):
    """Beam-search every batch."""
    with torch.no_grad():
        for batch in batches:
            gen.generate(gen.model.models, batch)


def decode_macs(gen, batch) -> float:
    """MACs per sentence of beam-searching ``batch``, measured."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        gen.generate(gen.model.models, batch)
    return counter.get_total_flops() / 2 / batch["net_input"]["src_tokens"].size(0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=34040, help="shared vocabulary (Table 11, WMT14 En-De)")
    p.add_argument("--batch-size", type=int, default=16, help="source sentences per batch")
    p.add_argument("--batches", type=int, default=2, help="batches per model per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    p.add_argument("--beam", type=int, default=4, help="Table 12: beam 4 for En-De")
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--tgt-len", type=int, default=20)
    add_arguments(p)
    args = p.parse_args(argv)
    check(p, args)
    torch.manual_seed(0)
    gens = {name: generator(to(m, args), args) for name, m in models(args.vocab).items()}
    batches = to(random_source_batches(args.batches, args.batch_size, args.src_len, args.vocab), args)
    result = {name: {"params": param_counts(gen.model.models[0])["params"], "macs_per_sentence": decode_macs(gen, batches[0])}
              for name, gen in gens.items()}
    for gen in gens.values():  # warm-up: first-call allocations (and CUDA's kernel loading) are not timed
        decode(gen, batches[:1])
    seconds = alternating_rounds({name: partial(decode, gen, batches) for name, gen in gens.items()},
                                 args.rounds, lambda: clock(args))
    sentences = args.rounds * args.batches * args.batch_size
    for name, res in result.items():
        res["sentences_per_s"] = round(sentences / seconds[name], 2)
        res["tokens_per_s"] = round(sentences * args.tgt_len / seconds[name], 1)
        print(f"{name:>32}: {res['sentences_per_s']:7.2f} sentences/s  {res['tokens_per_s']:8.1f} tokens/s  "
              f"params {res['params'] / 1e6:.1f}M  MACs/sentence {res['macs_per_sentence'] / 1e9:.2f}B")
    partialformer, transformer = result["partialformer_24_6_d360_h30_16"], result["transformer_24_6_d360"]
    ratio = partialformer["sentences_per_s"] / transformer["sentences_per_s"]
    macs_ratio = transformer["macs_per_sentence"] / partialformer["macs_per_sentence"]
    print(f"speed ratio {ratio:.3f}, MACs ratio {macs_ratio:.3f}")
    print(json.dumps({"threads": torch.get_num_threads(), **describe(args), "beam": args.beam, "batch_size": args.batch_size,
                      "rounds": args.rounds, **result, "ratio": round(ratio, 3), "macs_ratio": round(macs_ratio, 3),
                      "ratio_over_macs_ratio": round(ratio / macs_ratio, 3)}))


if __name__ == "__main__":
    main()
