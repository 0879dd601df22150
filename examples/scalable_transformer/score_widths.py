"""sacreBLEU of a scalable model's sub-Transformers, one width after another (Gao et al. 2021, Table 2).

    python examples/scalable_transformer/score_widths.py --data BIN --checkpoint CKPT --widths 64,128,192,256
        --bpe-codes CODES --ref REFERENCE [--beam 4 --lenpen 0.6] [--json OUT.json] [--label NAME]

Decodes the test set with ``fairseq-generate --task scalable_translation --eval-width W`` (type-1)
for every width, detokenizes (Moses, subword-nmt), scores with sacreBLEU and prints one markdown
row; ``--json`` appends ``{"label", "widths", "bleu", "signature"}`` as one line. A checkpoint
exported with ``export_subnet`` is scored with ``--widths exported``.
"""
import argparse
import json
from pathlib import Path

from fairseq_widearch.experiments.scoring import corpus_bleu, generate


def translate(args, width: str, out: Path):
    task = [] if width == "exported" else ["--task", "scalable_translation", "--eval-width", width]
    generate(args.data, args.checkpoint, out, args.bpe_codes, args.beam, args.lenpen, *task, subset=args.subset,
             source_lang=args.source_lang, target_lang=args.target_lang)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--widths", required=True, help="comma-separated widths, or 'exported'")
    p.add_argument("--bpe-codes", required=True)
    p.add_argument("--ref", required=True, help="raw reference file")
    p.add_argument("--subset", default="test")
    p.add_argument("--source-lang", default="en")
    p.add_argument("--target-lang", default="de")
    p.add_argument("--beam", default="4")
    p.add_argument("--lenpen", default="0.6")
    p.add_argument("--json", default=None, help="append the scores to this JSON-lines file")
    p.add_argument("--label", default="", help="row label (e.g. the training stages)")
    args = p.parse_args(argv)
    scores, signature = [], ""
    for width in args.widths.split(","):
        out = Path(args.checkpoint).with_suffix(f".generate-{width}.txt")
        translate(args, width, out)
        score, signature = corpus_bleu(out, args.ref)
        scores.append(round(score.score, 2))
        signature = str(signature)
    print(f"| {args.label} | " + " | ".join(map(str, scores)) + f" |\nsignature: {signature}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"label": args.label, "widths": args.widths.split(","), "bleu": scores,
                                "signature": signature}) + "\n")


if __name__ == "__main__":
    main()
