"""examples/claims/study.py on its tiny claims: two `_tiny` runs, one resumed, skipped once done; the
scalable model's three stages."""
import json
import sys
from argparse import Namespace

import pytest

from conftest import REPO, run

sys.path.insert(0, str(REPO / "examples" / "claims"))
import study  # noqa: E402

STUDY = REPO / "examples" / "claims" / "study.py"


def run_study(data, work, max_epoch=2, claims="tiny"):
    """The study's ``claims`` in ``work``; -> (its printed table, its result rows)."""
    root = data.parent
    out = run([sys.executable, STUDY, "--data", data, "--bpe-codes", root / "bpe" / "codes", "--ref",
               root / "test.ref.de", "--work-dir", work, "--claims", claims, "--max-epoch", max_epoch,
               "--beam", 1, "--max-len-b", 8]).stdout  # untrained models would loop to 200 tokens
    return out, [json.loads(line) for line in (work / "results.jsonl").read_text().splitlines()]


def without_timing(rows):
    return sorted(({k: v for k, v in r.items() if k != "train_seconds"} for r in rows),
                  key=lambda r: (r["system"], r["seed"]))


def test_the_study_resumes_interrupted_runs_and_skips_finished_ones(multi30k_bin, tmp_path):
    _, whole = run_study(multi30k_bin, tmp_path / "whole")
    # An interrupted run: the first system trained for one epoch, nothing scored yet.
    claim = study.CLAIMS["tiny"]
    interrupted = study.run_dir(tmp_path / "resumed", claim, claim.systems[0], 1)
    study.fairseq_train(Namespace(device="cpu", max_epoch=1, patience=3), multi30k_bin, claim.systems[0].flags,
                        interrupted, 1)
    (interrupted / "training.json").unlink()  # a killed run never wrote it
    table, resumed = run_study(multi30k_bin, tmp_path / "resumed")
    assert "Loaded checkpoint" in (interrupted / "train.log").read_text()
    assert without_timing(resumed) == without_timing(whole)
    # Both tiny systems end within 1 BLEU of each other, so each ran with seeds 1 and 2.
    assert sorted((r["system"], r["seed"]) for r in whole) == sorted(
        (s.name, seed) for s in claim.systems for seed in (1, 2))
    assert all(r["epochs"] == 2 and r["updates"] > 0 and r["bleu_signature"].startswith("nrefs:1") for r in whole)
    assert all(name in table for name in ("widenet_tiny", "multipath_transformer_tiny"))
    assert (tmp_path / "resumed" / "claim_tiny.png").stat().st_size > 0
    # the figure's curves: fairseq's validation loss after each epoch, the resumed epoch once
    assert [len(study.curve(study.run_dir(tmp_path / "resumed", claim, s, 1), s)) for s in claim.systems] == [2, 2]
    # Run again: everything is done, nothing trains, no row is added.
    logs = {p: p.stat().st_size for p in (tmp_path / "resumed").rglob("train.log")}
    _, again = run_study(multi30k_bin, tmp_path / "resumed")
    assert again == resumed
    assert {p: p.stat().st_size for p in logs} == logs


def test_a_second_seed_only_where_the_design_is_within_1_bleu_of_a_baseline():
    claim = study.CLAIMS["multipath"]
    rows = [{"claim": "multipath", "seed": 1, "system": name, "bleu": bleu}
            for name, bleu in [("multi-path 3 x 4", 30.0), ("deep 12 x 1", 28.5), ("shallow 3 x 1", 27.0)]]
    assert study.close_claims(rows, [claim]) == []
    rows[1]["bleu"] = 29.2
    assert study.close_claims(rows, [claim]) == [claim]


def test_the_scalable_path_trains_three_stages_and_scores_every_width(multi30k_bin, tmp_path):
    _, rows = run_study(multi30k_bin, tmp_path, max_epoch=1, claims="tiny_scalable")
    run = study.run_dir(tmp_path, study.CLAIMS["tiny_scalable"], study.CLAIMS["tiny_scalable"].systems[0], 1)
    stage3 = (run / "stage3" / "train.log").read_text()
    # stage 3 fine-tunes the stage-2 model on its own outputs for the training set
    assert f"Loaded checkpoint {run / 'stage2' / 'checkpoint_last.pt'}" in stage3
    assert f"'data': '{run / 'distilled'}'" in stage3
    assert [(r["system"], r["seed"], r["epochs"]) for r in rows] == [
        ("scalable_tiny w64", 1, "1+1+1"), ("scalable_tiny w128", 1, "1+1+1")]
    narrow, wide = rows
    assert narrow["params"] < wide["params"]
    # each width validated and decoded as its own sub-Transformer, not the widest twice
    assert narrow["valid_loss"] != wide["valid_loss"]
    assert len(study.curve(run, study.CLAIMS["tiny_scalable"].systems[0])) == 3  # stages 1-3, an epoch each
    # Interrupted after training, before its rows were written: scored again, no stage retrained.
    logs = {p: p.stat().st_size for p in run.rglob("train.log")}
    (tmp_path / "results.jsonl").unlink()
    _, again = run_study(multi30k_bin, tmp_path, max_epoch=1, claims="tiny_scalable")
    assert again == rows
    assert {p: p.stat().st_size for p in logs} == logs


def test_a_failed_run_does_not_cost_the_rows_of_the_runs_beside_it(tmp_path, monkeypatch):
    claim = study.CLAIMS["multipath"]
    failing = claim.systems[0]

    def run_system(args, claim, system, seed):
        if system is failing:
            raise RuntimeError("killed")
        return [{"claim": claim.name, "system": system.name, "seed": seed}]

    monkeypatch.setattr(study, "run_system", run_system)
    results = study.Results(tmp_path / "results.jsonl")
    with pytest.raises(RuntimeError, match="killed"):
        study.run_all(Namespace(jobs=2), results, [claim], 1)
    recorded = study.Results(tmp_path / "results.jsonl")
    assert [recorded.done(claim, s, 1) for s in claim.systems] == [False, True, True]


def validation_log(save, losses):
    """A fairseq-train log of ``save`` with these validation losses, one per epoch."""
    save.mkdir(parents=True)
    (save / "train.log").write_text("".join(
        f"2026-11-23 19:25:32 | INFO | valid | epoch {e:03d} | valid on 'valid' subset | loss {loss} | nll_loss 2.7 "
        f"| ppl 6.5 | num_updates {132 * e} | best_loss {loss}\n" for e, loss in enumerate(losses, 1)))


def test_progress_says_where_every_run_stands_from_its_logs(tmp_path):
    claims = [study.CLAIMS["partialformer"], study.CLAIMS["tiny_scalable"]]
    partialformer, transformer = claims[0].systems
    validation_log(study.run_dir(tmp_path, claims[0], partialformer, 1), [5.1, 4.6, 4.7])
    scalable = study.run_dir(tmp_path, claims[1], claims[1].systems[0], 1)
    validation_log(scalable / "stage1", [5.0, 4.8])
    (scalable / "stage1" / "training.json").write_text("{}")
    validation_log(scalable / "stage2", [4.9])
    lines = study.progress(tmp_path, study.Results(tmp_path / "results.jsonl"), claims).splitlines()[2:]
    assert lines == ["| partialformer | PartialFormer | 1 | in progress, epochs 1-3 | 4.600 (2) |",
                     "| partialformer | Transformer 4 + 4 | 1 | not started |  |",
                     "| tiny_scalable | scalable_tiny | 1 | stage 1 trained, epochs 1-2; stage 2 in progress, epochs 1-1 "
                     "| stage 2 4.900 (1) |"]


def test_tables_list_a_claims_systems_in_its_order_whatever_order_they_finished_in():
    rows = [{"claim": "scalable", "system": name, "seed": 1, "params": 1e6, "epochs": 3, "updates": 9,
             "train_seconds": 1.0, "valid_loss": 4.0, "bleu": 30.0}
            for name in ["independent w128", "scalable w128", "independent w64", "scalable w64"]]
    table = study.table(rows, study.CLAIMS["scalable"]).splitlines()[2:]
    assert [line.split(" | ")[0] for line in table] == [
        "| scalable w64", "| scalable w128", "| independent w64", "| independent w128"]
