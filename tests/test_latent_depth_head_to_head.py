"""The latent-depth head-to-head (examples/latent_depth/head_to_head.py over multi30k_o2m.sh): a run
trains its fixed number of updates, each pair's sacreBLEU line is the score (not the scorer's header),
and the row and the report carry it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import head_to_head  # noqa: E402  (examples/latent_depth, on the path testing_utils sets)
from testing_utils import REPO, cli

VENV = str(Path(sys.executable).parent.parent)  # this test run's virtualenv, for the recipe


def small_multi30k(src, dst, lines=((("train", 300), ("val", 8), ("test_2016_flickr", 4)))):
    dst.mkdir()
    for split, n in lines:
        for lang in ("en", "de", "fr", "cs"):
            head = (src / f"{split}.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)[:n]
            (dst / f"{split}.{lang}").write_text("".join(head), encoding="utf-8")
    return dst


@pytest.mark.slow
@pytest.mark.e2e
def test_a_run_trains_its_updates_and_records_every_pairs_score(multi30k_o2m_dir, tmp_path, monkeypatch):
    data, results = small_multi30k(multi30k_o2m_dir, tmp_path / "raw"), tmp_path / "rows.jsonl"
    monkeypatch.setenv("VENV", VENV)
    proc = cli(head_to_head, "run", "--systems", "ours-objective_released,anchor_initialised", "--seeds", "1",
               "--max-update", "2", "--decode", "sampled", "--jobs", "2", "--results", results, "--work-dir",
               tmp_path / "work", "--data-dir", data)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["system"]: r for r in map(json.loads, results.read_text().splitlines())}
    # the anchor with initialised logits starts every pair's and layer's q(z = 1) at 0.5, as ours
    # (2 updates at a warm-up learning rate of 2e-5 barely move them); the released code's start
    # from uninitialised memory
    mended = rows.pop("anchor_initialised")
    assert mended["updates"] == 2 and sorted(mended["decode"]["sampled"]) == ["cs", "de", "fr"]
    assert all(abs(q - 0.5) < 0.01 for pair in mended["q_decoder"] for q in pair), mended["q_decoder"]
    [row] = rows.values()
    assert row["system"] == "ours-objective_released" and row["updates"] == 2 and row["updates_per_s"] > 0
    assert sorted(row["decode"]["sampled"]) == ["cs", "de", "fr"] and len(row["q_decoder"]) == 3
    assert all(score["ratio"] > 0 for score in row["decode"]["sampled"].values())
    gen = (tmp_path / "work" / "generate-ours-objective_released-seed1-sampled-en-de.txt").read_text()
    assert gen.count("\nD-") + gen.startswith("D-") == 4  # every test sentence decoded
    report = cli(head_to_head, "report", "--results", results)
    assert report.returncode == 0 and "| ours-objective_released | sampled | 2 |" in report.stdout
    # a second run of the recipe decodes again without training past --max-update
    again = subprocess.run(["bash", str(REPO / "examples" / "latent_depth" / "multi30k_o2m.sh"), "--objective",
                            "released", "--max-update", "2", "--decode", "hard", "--work-dir", str(tmp_path / "work"),
                            "--data-dir", str(data)], capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    lines = [ln for ln in again.stdout.splitlines() if ln.startswith("| ours-objective_released-seed1 en-")]
    assert len(lines) == 3 and all(": BLEU = " in ln and "ratio = " in ln for ln in lines)
    assert "| ours-objective_released-seed1: 2 updates" in again.stdout


def test_a_gap_counts_only_where_it_exceeds_the_seeds_spread():
    assert head_to_head.gap([35.0, 35.2], [30.0, 31.0]).endswith("exceeds the spread")
    assert head_to_head.gap([31.0, 33.0], [30.0, 32.0]).startswith("+1.00 (spread 2.83): within the spread")
    assert head_to_head.gap([35.0], [30.0, 31.0]) == "+4.50: fewer than two seeds, no verdict"
