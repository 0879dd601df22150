"""Quick start: where the data comes from (``--data-dir``, ``$MULTI30K_DIR``, else the public release),
clear errors on a missing or malformed data directory, a failed download or a bad option, extra
fairseq-train flags after ``--``, and sacreBLEU's score as the last lines printed."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testing_utils import REPO

PREPARE = REPO / "examples" / "multi30k" / "prepare.py"


def prepare(data_dir, work_dir):
    return subprocess.run([sys.executable, str(PREPARE), "--data-dir", str(data_dir), "--work-dir", str(work_dir)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
def test_missing_data_dir(tmp_path):
    proc = prepare(tmp_path / "nowhere", tmp_path / "work")
    assert proc.returncode != 0
    assert "does not exist" in proc.stderr and "train,val,test_2016_flickr" in proc.stderr


@pytest.mark.e2e
def test_data_dir_without_the_expected_files(tmp_path):
    (tmp_path / "train.en").write_text("a dog .\n")
    proc = prepare(tmp_path, tmp_path / "work")
    assert proc.returncode != 0
    assert "malformed data directory" in proc.stderr and "train.de" in proc.stderr


def prepare_by_default(work_dir, **env):
    """prepare.py with no --data-dir and no $MULTI30K_DIR, every download refused (a proxy on a closed
    port), ``env`` added."""
    base = {k: v for k, v in os.environ.items() if k.lower() not in ("multi30k_dir", "no_proxy")}
    refused = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    return subprocess.run([sys.executable, str(PREPARE), "--work-dir", str(work_dir)], capture_output=True,
                          text=True, timeout=120, env={**base, **refused, **env})


@pytest.mark.e2e
def test_without_a_local_copy_the_release_is_downloaded_and_a_failed_download_names_the_flag(tmp_path):
    proc = prepare_by_default(tmp_path / "work")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "| downloading https://raw.githubusercontent.com/multi30k/dataset/" in proc.stdout
    assert "could not download the Multi30k release" in proc.stderr
    assert "pass --data-dir DIR or set MULTI30K_DIR=DIR" in proc.stderr and "train,val,test_2016_flickr" in proc.stderr


@pytest.mark.e2e
def test_multi30k_dir_names_the_local_copy(tmp_path):
    proc = prepare_by_default(tmp_path / "work", MULTI30K_DIR=str(tmp_path / "nowhere"))
    assert proc.returncode != 0 and "downloading" not in proc.stdout
    assert f"data directory {tmp_path / 'nowhere'} does not exist" in proc.stderr


@pytest.mark.e2e
def test_a_prepared_work_dir_needs_no_raw_text(tmp_path):
    """What setup.sh does before every recipe: a work dir prepared earlier is kept, nothing downloaded."""
    work = tmp_path / "work"
    (work / "bin").mkdir(parents=True)
    (work / "bin" / "test.en-de.de.bin").write_bytes(b"")
    (work / "test.ref.de").write_text("ein Hund .\n")
    proc = prepare_by_default(work)
    assert proc.returncode == 0, proc.stderr
    assert "already prepared" in proc.stdout and "downloading" not in proc.stdout


@pytest.mark.e2e
def test_misaligned_sides(tmp_path):
    for name in ("train", "val", "test_2016_flickr"):
        (tmp_path / f"{name}.en").write_text("a dog .\na cat .\n")
        (tmp_path / f"{name}.de").write_text("ein Hund .\n")
    proc = prepare(tmp_path, tmp_path / "work")
    assert proc.returncode != 0 and "line-aligned" in proc.stderr


def test_score_restores_corpus_order_and_checks_the_count(tmp_path):
    from fairseq_widearch.experiments import scoring as score

    gen = tmp_path / "gen.txt"
    one, two = "ein Hund rennt durch den Park .", "zwei Hunde spielen im Schnee ."
    gen.write_text(f"S-1\tb\nD-1\t-0.2\t{two}\nH-1\t-0.2\t{two}\nD-0\t-0.1\t{one}\n")
    refs = tmp_path / "ref.de"
    refs.write_text(f"{one}\n{two}\n")
    assert score.read_hypotheses(gen) == [one, two]
    assert score.main([gen, refs]) == pytest.approx(100.0)  # hypotheses matched to their own references
    refs.write_text(f"{one}\n")
    with pytest.raises(SystemExit, match="holds 2 hypotheses but .* has 1 references"):
        score.main([gen, refs])


def test_a_part_of_the_set_is_scored_against_the_references_of_its_ids(tmp_path):
    """What ``fairseq-generate --distributed-world-size 2 --distributed-rank 0`` writes: some ids
    only (the CUDA tier decodes half of test_2016 so; testing_utils.DECODE_HALF)."""
    from fairseq_widearch.experiments.scoring import corpus_bleu

    refs = ["ein Hund rennt durch den Park .", "zwei Hunde spielen im Schnee .", "eine Frau liest ein Buch .",
            "ein Mann fährt Fahrrad ."]
    (tmp_path / "ref.de").write_text("".join(f"{r}\n" for r in refs))
    gen = tmp_path / "gen.txt"
    gen.write_text(f"D-3\t-0.1\t{refs[3]}\nD-1\t-0.1\t{refs[1]}\n")
    assert corpus_bleu(gen, tmp_path / "ref.de", part=True)[0].score == pytest.approx(100.0)
    gen.write_text(f"D-3\t-0.1\t{refs[1]}\nD-1\t-0.1\t{refs[3]}\n")  # each against the other's reference
    assert corpus_bleu(gen, tmp_path / "ref.de", part=True)[0].score < 10
    with pytest.raises(SystemExit, match="holds 2 hypotheses but .* has 4 references"):
        corpus_bleu(gen, tmp_path / "ref.de")


QUICKSTART = REPO / "examples" / "multi30k" / "quickstart.sh"


def quickstart(*args):
    """README's first command with ``args``, using this test run's virtualenv."""
    env = {**os.environ, "VENV": str(Path(sys.executable).parent.parent)}
    return subprocess.run(["bash", str(QUICKSTART), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.parametrize("updates", ["abc", "-1", "0", "1.5"])
@pytest.mark.e2e
def test_updates_must_be_a_positive_whole_number(updates, tmp_path):
    proc = quickstart("--updates", updates, "--work-dir", tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith(f"error: argument --updates: takes a whole number >= 1, got '{updates}'")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("minutes", ["abc", "-1", "0"])
@pytest.mark.e2e
def test_minutes_must_be_a_positive_number(minutes, tmp_path):
    proc = quickstart("--minutes", minutes, "--work-dir", tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith(f"error: argument --minutes: takes a number above 0 (e.g. 15 or 0.5), "
                                        f"got '{minutes}'")
    assert not any(tmp_path.iterdir())  # stopped before preparing or training anything


@pytest.mark.slow
@pytest.mark.e2e
def test_extra_flags_reach_fairseq_train_and_sacrebleu_ends_the_output(multi30k_dir, tmp_path):
    """``-- FLAGS`` as README shows it, on a small copy of Multi30k (200 training, 24 test lines)."""
    data = tmp_path / "data"
    data.mkdir()
    for split, lines in (("train", 200), ("val", 24), ("test_2016_flickr", 24)):
        for lang in ("en", "de"):
            head = (multi30k_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
            (data / f"{split}.{lang}").write_text("".join(head), encoding="utf-8")
    proc = quickstart("--data-dir", data, "--work-dir", tmp_path / "work", "--updates", "1000", "--minutes", "0.001",
                      "--", "--max-tokens", "1024")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "max tokens per device = 1024" in proc.stdout
    # the update budget is the default; --minutes is an upper bound, reported when it cuts training short
    assert "| training multipath_transformer_multi30k for 1000 updates (at most 0.001 minutes)" in proc.stdout
    assert "| warning: --minutes 0.001 cut training short at 1 of 1000 updates" in proc.stderr
    header, score, signature = proc.stdout.strip().splitlines()[-3:]
    assert header.startswith("| sacreBLEU of the detokenized translations")
    assert score.startswith("BLEU = ") and signature.startswith("signature: nrefs:1|")
    assert "BPE tokens" not in proc.stdout + proc.stderr  # fairseq-generate's warning about its own BLEU
