"""Decoding with ``fairseq-generate`` and sacreBLEU scoring of its detokenized output against raw
references (the quick start's, the recipes', the comparison's and the claims study's), and the
teacher-forced NLL of a model on prepared batches.

    python -m fairseq_widearch.experiments.scoring GENERATE_OUTPUT REFERENCE_FILE

prints the BLEU score of the ``D-<id>`` lines of ``fairseq-generate --tokenizer moses --bpe
subword_nmt`` output, in corpus order, then its signature.
"""
import argparse
import math
import subprocess
import sys
from pathlib import Path

import torch
from fairseq import checkpoint_utils
from sacrebleu.metrics import BLEU

#: The plugin's directory: fairseq's ``--user-dir``.
USER_DIR = Path(__file__).resolve().parents[1]
#: Where this Python's fairseq commands (``fairseq-train``, ``fairseq-generate``, ...) are.
BIN = Path(sys.executable).parent


def read_hypotheses_by_id(path) -> dict:
    """Sentence id -> detokenized hypothesis (``D-`` lines) of ``fairseq-generate`` output."""
    hyps = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("D-"):
                ident, _score, text = line.rstrip("\n").split("\t", 2)
                hyps[int(ident[2:])] = text
    return hyps


def read_hypotheses(path):
    """The detokenized hypotheses (``D-`` lines) of ``fairseq-generate`` output, in corpus order."""
    hyps = read_hypotheses_by_id(path)
    return [hyps[i] for i in sorted(hyps)]


def generate_args(data, checkpoint, bpe_codes, beam, lenpen, *extra, subset="test", source_lang="en",
                  target_lang="de", cpu=True) -> list:
    """``fairseq-generate``'s arguments (strings) that decode ``subset`` by beam search, Moses and
    subword-nmt undone in the ``D-`` lines (``extra``: more flags; ``cpu=False``: on fairseq's
    default device, CUDA if there is one)."""
    args = [data, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", subset, *(["--cpu"] if cpu else []),
            "--beam", beam, "--lenpen", lenpen, "--batch-size", "128", "--tokenizer", "moses", "--bpe", "subword_nmt",
            "--bpe-codes", bpe_codes, "--source-lang", source_lang, "--target-lang", target_lang, *extra]
    return [str(a) for a in args]


def generate(data, checkpoint, out, *args, **kwargs):
    """Decode with ``fairseq-generate`` on the arguments of ``generate_args``, write its output to
    ``out`` and return its log (stderr, which holds the "Translated N sentences ... (X sentences/s
    ...)" timing line).

    Raises:
        subprocess.CalledProcessError: if fairseq-generate fails (its log in ``stderr``).
    """
    cmd = [str(BIN / "fairseq-generate"), *generate_args(data, checkpoint, *args, **kwargs)]
    with open(out, "w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, check=True).stderr


def corpus_bleu(gen_out, ref_path, part=False):
    """-> (sacreBLEU score object, signature) of ``fairseq-generate`` output against raw references.
    ``part=True`` scores the sentences decoded (one shard of a set: ``fairseq-generate
    --distributed-world-size N --distributed-rank R`` decodes every N-th batch), each against the
    reference of its id.

    Raises:
        SystemExit: if, without ``part``, the hypothesis and reference counts differ, naming both files.
    """
    by_id = read_hypotheses_by_id(gen_out)
    refs = [line.rstrip("\n") for line in open(ref_path, encoding="utf-8")]
    if part:
        refs = [refs[i] for i in sorted(by_id)]
    elif len(by_id) != len(refs):
        sys.exit(f"error: {gen_out} holds {len(by_id)} hypotheses but {ref_path} has {len(refs)} references")
    hyps = [by_id[i] for i in sorted(by_id)]
    bleu = BLEU()
    return bleu.corpus_score(hyps, [refs]), bleu.get_signature()


def load_scalable(checkpoint: str, data: str):
    """-> (the ``scalable_transformer`` of ``checkpoint`` in eval mode, its task on ``data``).

    Raises:
        SystemExit: if the checkpoint holds another model, naming it.
    """
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    model = models[0].eval()
    if not hasattr(model, "set_sample_config"):
        sys.exit(f"error: {checkpoint} holds a {model.__class__.__name__}, not a scalable_transformer")
    return model, task


def validation_nll(model, samples: list, pad: int) -> float:
    """Teacher-forced NLL of ``model`` (a scalable model's active sub-Transformer) on ``samples``
    (fairseq batches), bits per target token."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for sample in samples:
            lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
            target = sample["target"]
            nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            keep = target.ne(pad)
            total, tokens = total + nll[keep].sum().item(), tokens + int(keep.sum())
    return total / tokens / math.log(2)


def main(argv=None):
    p = argparse.ArgumentParser(description="sacreBLEU of fairseq-generate's detokenized hypotheses against a "
                                            "raw reference")
    p.add_argument("generate_output", help="fairseq-generate's output (its D- lines)")
    p.add_argument("reference", help="the raw reference, one sentence per line")
    args = p.parse_args(None if argv is None else [str(a) for a in argv])
    gen_out, ref_path = args.generate_output, args.reference
    score, signature = corpus_bleu(gen_out, ref_path)
    print(f"| sacreBLEU of the detokenized translations against {ref_path}:\n{score}\nsignature: {signature}")
    return score.score


if __name__ == "__main__":
    main()
