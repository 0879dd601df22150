#!/usr/bin/env python
"""Prepare Multi30k (task 1) for fairseq: sacremoses tokenization, subword-nmt joint BPE,
``fairseq-preprocess`` with one dictionary shared by all languages.

``--tgt de`` gives a bilingual En-De directory (``--joined-dictionary``); ``--tgt de,fr,cs`` the
one-to-many directory of ``translation_multi_simple_epoch`` (pairs en-de, en-fr, en-cs; BPE and
dictionary learnt on all four languages).

Reads raw, untokenized, line-aligned text ``{train,val,test_2016_flickr}.{src,tgt}`` from
``--data-dir``, else from ``$MULTI30K_DIR``; with neither, the public release
(github.com/multi30k/dataset, task 1, raw) is downloaded into ``--work-dir/raw`` once and read from
there, and a ``--work-dir`` already prepared is kept as it is without reading any raw text. Writes
``--work-dir/{tok,bpe,bin}``; ``bin`` is the fairseq data directory (splits train/valid/test),
``bpe/codes`` the BPE codes and ``test.ref.<tgt>`` the raw test reference of each target.

Exits with a message naming what was expected when the data directory is missing or malformed,
and naming ``--data-dir`` and ``$MULTI30K_DIR`` when the download fails.
"""
import argparse
import gzip
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
# The public Multi30k release (task 1, raw text), used when no local copy is named.
RELEASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"


def default_data_dir():
    """``$MULTI30K_DIR`` when set, else None (the release is downloaded)."""
    return Path(os.environ["MULTI30K_DIR"]) if os.environ.get("MULTI30K_DIR") else None


def check_data_dir(data_dir, langs):
    """Fail with a message saying what is expected unless every raw file is present,
    non-empty and line-aligned."""
    expected = f"raw Multi30k text files {{train,val,test_2016_flickr}}.{{{','.join(langs)}}}"
    if not data_dir.is_dir():
        sys.exit(f"error: data directory {data_dir} does not exist; expected a directory holding {expected}")
    for name in SPLITS.values():
        paths = [data_dir / f"{name}.{lang}" for lang in langs]
        missing = [str(p) for p in paths if not p.is_file() or p.stat().st_size == 0]
        if missing:
            sys.exit(f"error: malformed data directory {data_dir}: missing or empty {', '.join(missing)} "
                     f"(expected {expected}, one sentence per line)")
        counts = [sum(1 for _ in open(p, encoding="utf-8")) for p in paths]
        for path, count in zip(paths[1:], counts[1:]):
            if count != counts[0]:
                sys.exit(f"error: malformed data directory {data_dir}: {paths[0].name} has {counts[0]} lines "
                         f"but {path.name} has {count}; the sides must be line-aligned")


def download(raw_dir, langs):
    """Download the release's raw ``{train,val,test_2016_flickr}.{langs}`` into ``raw_dir``, the
    files absent there only; returns ``raw_dir``. Raises OSError naming the URL that failed."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    for name in SPLITS.values():
        for lang in langs:
            out = raw_dir / f"{name}.{lang}"
            if out.exists():
                continue
            url = RELEASE_URL.format(name=name, lang=lang)
            print(f"| downloading {url}", flush=True)
            try:
                with urllib.request.urlopen(url, timeout=60) as r:
                    text = gzip.decompress(r.read())
            except (urllib.error.URLError, OSError, EOFError) as e:
                raise OSError(f"could not download the Multi30k release ({url}: {e})") from e
            part = out.with_name(f"{out.name}.{os.getpid()}.part")  # whole or absent: later runs skip what exists
            part.write_bytes(text)
            part.replace(out)
    return raw_dir


def prepared(work_dir, src, tgts):
    """Whether ``work_dir`` holds a finished preparation: every pair binarized, every test reference."""
    return all((work_dir / "bin" / f"test.{src}-{tgt}.{tgt}.bin").exists()
               and (work_dir / f"test.ref.{tgt}").exists() for tgt in tgts)


def tokenize(in_path, out_path, lang, limit):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    norm, tok = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    with open(in_path, encoding="utf-8") as fin, open(out_path, "w", encoding="utf-8") as fout:
        for i, line in enumerate(fin):
            if limit and i >= limit:
                break
            fout.write(tok.tokenize(norm.normalize(line.strip()), escape=False, return_str=True) + "\n")


def learn_and_apply_bpe(tok_dir, bpe_dir, langs, merges):
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    codes = bpe_dir / "codes"
    joint = bpe_dir / "train.joint.tok"
    with open(joint, "w", encoding="utf-8") as f:
        for lang in langs:
            f.write((tok_dir / f"train.{lang}").read_text(encoding="utf-8"))
    with open(joint, encoding="utf-8") as fin, open(codes, "w", encoding="utf-8") as fout:
        learn_bpe(fin, fout, merges)
    joint.unlink()
    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f)
    for split in SPLITS:
        for lang in langs:
            with open(tok_dir / f"{split}.{lang}", encoding="utf-8") as fin, \
                    open(bpe_dir / f"{split}.{lang}", "w", encoding="utf-8") as fout:
                for line in fin:
                    fout.write(bpe.process_line(line))
    return codes


def preprocess(bpe_dir, bin_dir, src, tgt, dictionary_flags, workers):
    subprocess.run(
        [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt,
         "--trainpref", str(bpe_dir / "train"), "--validpref", str(bpe_dir / "valid"),
         "--testpref", str(bpe_dir / "test"), "--destdir", str(bin_dir), "--workers", str(workers),
         *dictionary_flags],
        check=True,
    )


def shared_dictionary(bpe_dir, langs, workers):
    """One fairseq dictionary over the BPE training text of every language."""
    with open(bpe_dir / "train.all", "w", encoding="utf-8") as f:
        for lang in langs:
            f.write((bpe_dir / f"train.{lang}").read_text(encoding="utf-8"))
    subprocess.run([sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--source-lang", "all",
                    "--trainpref", str(bpe_dir / "train"), "--destdir", str(bpe_dir), "--dict-only",
                    "--workers", str(workers)], check=True)
    (bpe_dir / "train.all").unlink()
    return bpe_dir / "dict.all.txt"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=None,
                   help="raw Multi30k directory (default: $MULTI30K_DIR, else the public release, downloaded "
                        "into WORK_DIR/raw)")
    p.add_argument("--work-dir", type=Path, required=True, help="output directory")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de", help="target language, or a comma-separated list (one-to-many)")
    p.add_argument("--bpe-merges", type=int, default=8000, help="subword-nmt joint BPE merge operations")
    p.add_argument("--max-train-lines", type=int, default=0, help="use only the first N training pairs (0 = all)")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    tgts = args.tgt.split(",")
    langs = [args.src, *tgts]

    data_dir = args.data_dir or default_data_dir()
    if data_dir is None:
        if prepared(args.work_dir, args.src, tgts):  # no copy named, none needed
            print(f"| {args.work_dir / 'bin'} already prepared", flush=True)
            return args.work_dir / "bin"
        try:
            data_dir = download(args.work_dir / "raw", langs)
        except OSError as e:
            sys.exit(f"error: {e}; pass --data-dir DIR or set MULTI30K_DIR=DIR to a local copy of its raw text, "
                     f"{{train,val,test_2016_flickr}}.{{{','.join(langs)}}}")
    check_data_dir(data_dir, langs)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    for tgt in tgts:  # the raw test references, for sacreBLEU against detokenized output
        shutil.copy(data_dir / f"{SPLITS['test']}.{tgt}", args.work_dir / f"test.ref.{tgt}")
    bin_dir = args.work_dir / "bin"
    if all((bin_dir / f"test.{args.src}-{tgt}.{tgt}.bin").exists() for tgt in tgts):
        print(f"| {bin_dir} already prepared", flush=True)
        return bin_dir
    tok_dir, bpe_dir = args.work_dir / "tok", args.work_dir / "bpe"
    for d in (tok_dir, bpe_dir):
        d.mkdir(parents=True, exist_ok=True)
    print(f"| tokenizing {data_dir} with sacremoses", flush=True)
    for split, name in SPLITS.items():
        for lang in langs:
            limit = args.max_train_lines if split == "train" else 0
            tokenize(data_dir / f"{name}.{lang}", tok_dir / f"{split}.{lang}", lang, limit)
    print(f"| learning {args.bpe_merges} joint BPE merges with subword-nmt", flush=True)
    learn_and_apply_bpe(tok_dir, bpe_dir, langs, args.bpe_merges)
    shutil.rmtree(bin_dir, ignore_errors=True)
    if len(tgts) == 1:
        preprocess(bpe_dir, bin_dir, args.src, tgts[0], ["--joined-dictionary"], args.workers)
    else:
        dictionary = shared_dictionary(bpe_dir, langs, args.workers)
        for tgt in tgts:
            preprocess(bpe_dir, bin_dir, args.src, tgt, ["--srcdict", dictionary, "--tgtdict", dictionary],
                       args.workers)
    return bin_dir


if __name__ == "__main__":
    main()
