"""Quick-start data preparation: clear errors on a missing or malformed data directory."""
import subprocess
import sys

import pytest

from conftest import REPO

PREPARE = REPO / "examples" / "multi30k" / "prepare.py"


def prepare(data_dir, work_dir):
    return subprocess.run([sys.executable, str(PREPARE), "--data-dir", str(data_dir), "--work-dir", str(work_dir)],
                          capture_output=True, text=True, timeout=300)


def test_missing_data_dir(tmp_path):
    proc = prepare(tmp_path / "nowhere", tmp_path / "work")
    assert proc.returncode != 0
    assert "does not exist" in proc.stderr and "train,val,test_2016_flickr" in proc.stderr


def test_data_dir_without_the_expected_files(tmp_path):
    (tmp_path / "train.en").write_text("a dog .\n")
    proc = prepare(tmp_path, tmp_path / "work")
    assert proc.returncode != 0
    assert "malformed data directory" in proc.stderr and "train.de" in proc.stderr


def test_misaligned_sides(tmp_path):
    for name in ("train", "val", "test_2016_flickr"):
        (tmp_path / f"{name}.en").write_text("a dog .\na cat .\n")
        (tmp_path / f"{name}.de").write_text("ein Hund .\n")
    proc = prepare(tmp_path, tmp_path / "work")
    assert proc.returncode != 0 and "line-aligned" in proc.stderr


def test_score_restores_corpus_order_and_checks_the_count(tmp_path):
    sys.path.insert(0, str(REPO / "examples" / "multi30k"))
    import score

    gen = tmp_path / "gen.txt"
    one, two = "ein Hund rennt durch den Park .", "zwei Hunde spielen im Schnee ."
    gen.write_text(f"S-1\tb\nD-1\t-0.2\t{two}\nH-1\t-0.2\t{two}\nD-0\t-0.1\t{one}\n")
    refs = tmp_path / "ref.de"
    refs.write_text(f"{one}\n{two}\n")
    assert score.read_hypotheses(gen) == [one, two]
    assert score.main(gen, refs) == pytest.approx(100.0)  # hypotheses matched to their own references
    refs.write_text(f"{one}\n")
    with pytest.raises(SystemExit, match="holds 2 hypotheses but .* has 1 references"):
        score.main(gen, refs)
