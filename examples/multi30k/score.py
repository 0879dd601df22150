#!/usr/bin/env python
"""Score ``fairseq-generate`` output with sacreBLEU against raw references.

    python score.py GENERATE_OUTPUT REFERENCE_FILE

Reads the detokenized hypotheses (``D-<id>`` lines, produced by ``fairseq-generate --tokenizer
moses --bpe subword_nmt``), restores corpus order, and prints the BLEU score and signature.
"""
import subprocess
import sys
from pathlib import Path

from sacrebleu.metrics import BLEU

ROOT = Path(__file__).resolve().parents[2]


def read_hypotheses(path):
    hyps = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("D-"):
                ident, _score, text = line.rstrip("\n").split("\t", 2)
                hyps[int(ident[2:])] = text
    return [hyps[i] for i in sorted(hyps)]


def generate(data, checkpoint, out, bpe_codes, beam, lenpen, *extra, subset="test", source_lang="en",
             target_lang="de", cpu=True):
    """Decode ``subset`` with ``fairseq-generate`` (beam search, Moses and subword-nmt undone in the
    ``D-`` lines; ``extra``: more flags; ``cpu=False``: on fairseq's default device, CUDA if there is
    one), write its output to ``out`` and return its log (stderr, which holds the "Translated N
    sentences ... (X sentences/s ...)" timing line).

    Raises:
        subprocess.CalledProcessError: if fairseq-generate fails (its log in ``stderr``).
    """
    cmd = [Path(sys.executable).parent / "fairseq-generate", data, "--user-dir", ROOT / "fairseq_widearch",
           "--path", checkpoint, "--gen-subset", subset, *(["--cpu"] if cpu else []), "--beam", beam, "--lenpen", lenpen,
           "--batch-size", "128", "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", bpe_codes,
           "--source-lang", source_lang, "--target-lang", target_lang, *extra]
    with open(out, "w") as f:
        return subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.PIPE, text=True, check=True).stderr


def corpus_bleu(gen_out, ref_path):
    """-> (sacreBLEU score object, signature) of ``fairseq-generate`` output against raw references.

    Raises:
        SystemExit: if the hypothesis and reference counts differ, naming both files.
    """
    hyps = read_hypotheses(gen_out)
    refs = [line.rstrip("\n") for line in open(ref_path, encoding="utf-8")]
    if len(hyps) != len(refs):
        sys.exit(f"error: {gen_out} holds {len(hyps)} hypotheses but {ref_path} has {len(refs)} references")
    bleu = BLEU()
    return bleu.corpus_score(hyps, [refs]), bleu.get_signature()


def main(gen_out, ref_path):
    score, signature = corpus_bleu(gen_out, ref_path)
    print(f"| sacreBLEU of the detokenized translations against {ref_path}:\n{score}\nsignature: {signature}")
    return score.score


if __name__ == "__main__":
    main(*sys.argv[1:3])
