"""Random search over the type-2 sub-Transformers of a ``scalable_transformer`` checkpoint.

    python -m fairseq_widearch.cli.search_subnets --checkpoint CKPT --data BIN [--subset valid]
        [--choices 896,960,1024] [--num-samples 1000] [--max-macs G] [--top-k 10] [--seed 1]
        [--max-sentences N] [--bleu --beam 4 --lenpen 0.6]

Gao et al. (2021), Sec. 4.4 / Table 9: type-2 sub-Transformers keep C = M_max and choose each
layer's attention/FFN width D^i freely; the paper drew 1,000 of them with D^i in {896, 960, 1024}
and kept the best on the validation set. This tool draws ``--num-samples`` distinct
configurations (D^i uniform over ``--choices``, default the model's width set) whose MACs (one
20 + 20-token teacher-forced forward, as the stats tool counts) stay within ``--max-macs``,
scores each by validation NLL (bits per target token, teacher-forced; ``--max-sentences`` limits
the sentences for a cheaper proxy), optionally re-scores the best ``--top-k`` by BLEU (beam search,
BPE removed, tokenized BLEU, for ranking only), and prints the top k with parameters and MACs,
the widest model first for reference. The last line is a JSON list of the rows.

Raises:
    SystemExit: if the checkpoint is not a ``scalable_transformer``, a choice is not a valid width,
        or no configuration fits the budget.
"""
import argparse
import json
import sys
from argparse import Namespace
from typing import List

import numpy as np
import torch
from fairseq import utils
from sacrebleu.metrics import BLEU

import fairseq_widearch  # noqa: F401  (registers the plugin, allows loading checkpoints)
from fairseq_widearch.experiments.counting import count_macs
from fairseq_widearch.experiments.data import batches
from fairseq_widearch.experiments.scoring import load_scalable, validation_nll
from fairseq_widearch.modules.sub_transformers import parse_widths, width_set

from . import check_subset, existing_dir, existing_file, number, whole


def validation_bleu(model, task, samples: list, beam: int, lenpen: float) -> float:
    """Tokenized BLEU of beam search with BPE removed (for ranking configurations)."""
    generator = task.build_generator([model], Namespace(beam=beam, lenpen=lenpen, max_len_b=200))
    tgt_dict, hyps, refs = task.target_dictionary, [], []
    with torch.no_grad():
        for sample in samples:
            for i, out in enumerate(task.inference_step(generator, [model], sample)):
                hyps.append(tgt_dict.string(out[0]["tokens"], "subword_nmt"))
                refs.append(tgt_dict.string(utils.strip_pad(sample["target"][i], tgt_dict.pad()), "subword_nmt"))
    return BLEU(tokenize="none").corpus_score(hyps, [refs]).score


def draw(choices: List[int], widest: List[int], count: int, fits, rng) -> List[List[int]]:
    """``count`` distinct per-layer width lists other than ``widest``, within the budget
    (rejection sampling)."""
    drawn, attempts = {}, 0
    while len(drawn) < count and attempts < 100 * count:
        attempts += 1
        dims = tuple(int(w) for w in rng.choice(choices, size=len(widest)))
        if dims not in drawn and list(dims) != widest and fits(dims):
            drawn[dims] = True
    return [list(d) for d in drawn]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, type=existing_file, help="a scalable_transformer checkpoint")
    p.add_argument("--data", required=True, type=existing_dir, help="binarized data directory")
    p.add_argument("--subset", default="valid")
    p.add_argument("--choices", default="", help="D^i choices (default: the model's width set M)")
    p.add_argument("--num-samples", type=whole(1), default=1000, help="configurations to score (paper: 1,000)")
    p.add_argument("--max-macs", type=number(0, meaning="0: none", low_included=True), default=0.0,
                   help="budget in GMACs at 20 + 20 tokens (0: none)")
    p.add_argument("--top-k", type=whole(1), default=10, help="configurations to keep")
    p.add_argument("--seed", type=whole(0), default=1)
    p.add_argument("--max-sentences", type=whole(0, "0: all"), default=0, help="score on the first N sentences (0: all)")
    p.add_argument("--bleu", action="store_true", help="re-rank the top k by validation BLEU")
    p.add_argument("--beam", type=whole(1), default=4)
    p.add_argument("--lenpen", type=number(), default=0.6, help="length penalty of the --bleu decoding")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    check_subset(p, args.data, args.subset)
    model, task = load_scalable(args.checkpoint, args.data)
    widest, widest_dims = model.widest_config()
    choices = parse_widths(args.choices) if args.choices else width_set(model.cfg)
    try:
        model.set_sample_config(widest, [min(choices)] * len(widest_dims))
        model.set_sample_config(widest, [max(choices)] * len(widest_dims))
    except ValueError as error:
        sys.exit(f"error: --choices {args.choices!r}: {error}")

    def macs(dims) -> float:
        model.set_sample_config(widest, dims)
        return count_macs(model) / 1e9

    def fits(dims) -> bool:
        return not args.max_macs or macs(dims) <= args.max_macs

    configs = draw(choices, list(widest_dims), args.num_samples, fits, np.random.default_rng(args.seed))
    if not configs:
        sys.exit(f"error: no configuration over {choices} fits --max-macs {args.max_macs}")
    samples = batches(task, args.subset, args.max_sentences)
    pad = task.target_dictionary.pad()

    def row(dims, label=""):
        macs_g = macs(dims)  # also activates dims
        return {"label": label, "layer_widths": dims, "params": model.sub_transformer_num_params(),
                "gmacs": round(macs_g, 4), "valid_nll": round(validation_nll(model, samples, pad), 4)}

    reference = row(list(widest_dims), "widest")
    rows = sorted((row(dims) for dims in configs), key=lambda r: r["valid_nll"])[: args.top_k]
    for r in [reference, *rows] if args.bleu else []:
        model.set_sample_config(widest, r["layer_widths"])
        r["valid_bleu"] = round(validation_bleu(model, task, samples, args.beam, args.lenpen), 2)
    if args.bleu:
        rows.sort(key=lambda r: -r["valid_bleu"])
    print(f"| {len(configs)} configurations over D^i in {choices} scored on {len(samples)} batches of '{args.subset}'")
    print("| rank | D^i (encoder, decoder) | params | GMACs | valid NLL (bits) |" + (" valid BLEU |" if args.bleu else ""))
    for rank, r in enumerate([reference, *rows]):
        print(f"| {r['label'] or rank} | {r['layer_widths']} | {r['params']:,} | {r['gmacs']} | {r['valid_nll']} |"
              + (f" {r['valid_bleu']} |" if args.bleu else ""))
    print(json.dumps([reference, *rows]))


if __name__ == "__main__":
    main()
