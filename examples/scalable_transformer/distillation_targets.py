"""Stage-3 targets of Scalable Transformers (Gao et al. 2021, Sec. 3.3, Eq. 9): the widest model's
beam outputs on the training set, binarized with the original dictionaries.

    python examples/scalable_transformer/distillation_targets.py --data BIN --checkpoint CKPT --out OUT_BIN
        [--source-lang en --target-lang de] [--beam 4 --lenpen 0.6] [--max-len 250 --max-ratio 20]
        [--max-tokens 8192] [--device cpu|cuda]

1. ``fairseq-generate --gen-subset train`` with the widest model (beam 4, length penalty 0.6);
2. drops pairs whose source or output is longer than ``--max-len`` tokens or whose length ratio
   exceeds ``--max-ratio`` (the paper's 250 and 20; 20 may be a typo for 2.0, so it is a flag);
3. ``fairseq-preprocess`` with BIN's dictionaries, and links BIN's valid/test sets, so OUT_BIN is a
   data directory for the stage-3 ``fairseq-train --distill-stage 3`` run.
Prints how many pairs were kept; exits with an error if none is.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
PLUGIN = Path(__file__).resolve().parents[2] / "fairseq_widearch"


def decode_training_set(args) -> dict:
    """{sentence id: (source tokens, widest-model output tokens)} for the training set."""
    proc = subprocess.run(
        [str(a) for a in [BIN / "fairseq-generate", args.data, "--user-dir", PLUGIN, "--path", args.checkpoint,
         "--gen-subset", "train",
         "--source-lang", args.source_lang, "--target-lang", args.target_lang, "--beam", str(args.beam),
         "--lenpen", str(args.lenpen), "--max-tokens", str(args.max_tokens),
         *(["--cpu"] if args.device == "cpu" else []),
         "--max-len-a", "0", "--max-len-b", str(args.max_len + 1),  # longer outputs would be dropped anyway
         "--skip-invalid-size-inputs-valid-test"]],  # the model is built at its widest sub-Transformer
        capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"error: fairseq-generate failed:\n{proc.stderr[-3000:]}")
    sources, outputs = {}, {}
    for line in proc.stdout.splitlines():
        if line.startswith("S-"):
            ident, text = line.split("\t", 1)
            sources[int(ident[2:])] = text
        elif line.startswith("H-"):
            ident, _score, text = line.split("\t", 2)
            outputs[int(ident[2:])] = text
    return {i: (sources[i], outputs[i]) for i in sorted(outputs)}


def keep(source: str, output: str, max_len: int, max_ratio: float) -> bool:
    s, t = len(source.split()), len(output.split())
    return 0 < s <= max_len and 0 < t <= max_len and max(s / t, t / s) <= max_ratio


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="binarized data directory of the training run")
    p.add_argument("--checkpoint", required=True, help="the scalable model (decoded at its widest)")
    p.add_argument("--out", required=True, help="output data directory")
    p.add_argument("--source-lang", default="en")
    p.add_argument("--target-lang", default="de")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--lenpen", type=float, default=0.6)
    p.add_argument("--max-len", type=int, default=250, help="drop pairs with a side longer than this (tokens)")
    p.add_argument("--max-ratio", type=float, default=20.0, help="drop pairs with a length ratio above this")
    p.add_argument("--max-tokens", type=int, default=8192, help="decoding batch size in source tokens")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where fairseq-generate decodes")
    args = p.parse_args(argv)
    out = Path(args.out)
    (out / "text").mkdir(parents=True, exist_ok=True)
    pairs = decode_training_set(args)
    kept = [pair for pair in pairs.values() if keep(*pair, args.max_len, args.max_ratio)]
    if not kept:  # fairseq-train would stop later on an empty file with an unrelated mmap error
        sys.exit(f"error: none of the {len(pairs)} decoded training pairs is within --max-len {args.max_len} "
                 f"and --max-ratio {args.max_ratio}: an untrained model's outputs run to the length limit; "
                 "train stage 2 further")
    prefix = out / "text" / "train"
    for side, lang in ((0, args.source_lang), (1, args.target_lang)):
        Path(f"{prefix}.{lang}").write_text("".join(pair[side] + "\n" for pair in kept), encoding="utf-8")
    data = Path(args.data)
    subprocess.run([str(BIN / "fairseq-preprocess"), "--source-lang", args.source_lang, "--target-lang", args.target_lang,
                    "--trainpref", str(prefix), "--srcdict", str(data / f"dict.{args.source_lang}.txt"),
                    "--tgtdict", str(data / f"dict.{args.target_lang}.txt"), "--destdir", str(out), "--workers", "2"],
                   check=True, capture_output=True)
    for path in data.iterdir():  # the evaluation sets stay the original ones
        if path.name.startswith(("valid.", "test")) and not (out / path.name).exists():
            os.symlink(path.resolve(), out / path.name)
    print(f"| kept {len(kept)} of {len(pairs)} decoded training pairs -> {out}")


if __name__ == "__main__":
    main()
