#!/usr/bin/env python
"""Score ``fairseq-generate`` output with sacreBLEU against raw references.

    python score.py GENERATE_OUTPUT REFERENCE_FILE

Reads the detokenized hypotheses (``D-<id>`` lines, produced by ``fairseq-generate --tokenizer
moses --bpe subword_nmt``), restores corpus order, and prints the BLEU score and signature.
"""
import sys

from sacrebleu.metrics import BLEU


def read_hypotheses(path):
    hyps = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("D-"):
                ident, _score, text = line.rstrip("\n").split("\t", 2)
                hyps[int(ident[2:])] = text
    return [hyps[i] for i in sorted(hyps)]


def main(gen_out, ref_path):
    hyps = read_hypotheses(gen_out)
    refs = [line.rstrip("\n") for line in open(ref_path, encoding="utf-8")]
    if len(hyps) != len(refs):
        sys.exit(f"error: {gen_out} holds {len(hyps)} hypotheses but {ref_path} has {len(refs)} references")
    bleu = BLEU()
    score = bleu.corpus_score(hyps, [refs])
    print(f"{score}\nsignature: {bleu.get_signature()}")
    return score.score


if __name__ == "__main__":
    main(*sys.argv[1:3])
