"""The claims study (fairseq_widearch.experiments.study) on tiny claims of its own: two `_tiny` runs,
one resumed, skipped once done; the scalable model's three stages."""
import contextlib
import io
import json
import os
from argparse import Namespace
from unittest import mock

import pytest
import torch

from fairseq_widearch.experiments import runner, study
from fairseq_widearch.experiments.claims import SCALABLE_TASK, Claim, System
from testing_utils import REPO, train

#: The study's machinery on two `_tiny` presets, and the scalable path (three stages, distillation,
#: per-width scoring) on `scalable_transformer_tiny`: not paper claims.
WIDENET_TINY = System("widenet_tiny", ("--arch", "widenet_tiny"))
TINY = {claim.name: claim for claim in [
    Claim("tiny", "smoke test: two tiny presets, no comparison (so no second seed)",
          (WIDENET_TINY, System("multipath_transformer_tiny", ("--arch", "multipath_transformer_tiny"))), ()),
    Claim("tiny_one", "the first system of tiny alone: one run", (WIDENET_TINY,), ()),
    Claim("tiny_scalable", "smoke test: the scalable path on its tiny preset",
          (System("scalable_tiny", ("--arch", "scalable_transformer_tiny", *SCALABLE_TASK), widths=(64, 128)),),
          ()),
]}


def run_study(data, work, max_epoch=2, claims="tiny", results=None):
    """The study's ``claims`` of :data:`TINY` in ``work`` (``results``: its results file, default in
    ``work``), in this process (its environment restored after); -> (its printed table, its result rows)."""
    root = data.parent
    argv = ["--data", data, "--bpe-codes", root / "bpe" / "codes", "--ref", root / "test.ref.de", "--work-dir", work,
            "--claims", claims, "--max-epoch", max_epoch, "--beam", 1,
            "--max-len-b", 8,  # untrained models would loop to 200 tokens
            *(["--results", results] if results else [])]
    out = io.StringIO()
    with mock.patch.dict(os.environ), contextlib.redirect_stdout(out):
        study.main([str(a) for a in argv], claims=TINY)
    return out.getvalue(), [json.loads(line) for line in (results or work / "results.jsonl").read_text().splitlines()]


def without_timing(rows):
    return sorted(({k: v for k, v in r.items() if k != "train_seconds"} for r in rows),
                  key=lambda r: (r["system"], r["seed"]))


@pytest.mark.slow
@pytest.mark.e2e
def test_the_study_resumes_interrupted_runs_and_skips_finished_ones(multi30k_slice_bin, tmp_path):
    # An interrupted run: the first system trained for one epoch, nothing scored yet.
    claim = TINY["tiny"]
    interrupted = study.run_dir(tmp_path / "resumed", claim, claim.systems[0], 1)
    study.fairseq_train(Namespace(device="cpu", max_epoch=1, patience=3), multi30k_slice_bin, claim.systems[0].flags,
                        interrupted, 1)
    (interrupted / "training.json").unlink()  # a killed run never wrote it
    kept = tmp_path / "kept" / "claims.jsonl"  # a results file apart from the work directory
    table, resumed = run_study(multi30k_slice_bin, tmp_path / "resumed", results=kept)
    assert "Loaded checkpoint" in (interrupted / "train.log").read_text()
    # the resumed run's row equals that of the same run uninterrupted
    _, [whole] = run_study(multi30k_slice_bin, tmp_path / "whole", claims="tiny_one")
    first = next(r for r in resumed if r["system"] == claim.systems[0].name and r["seed"] == 1)
    assert without_timing([{**first, "claim": "tiny_one"}]) == without_timing([whole])
    # the claim compares nothing, so each system ran with seed 1 alone (the second seed's rule has
    # tests of its own)
    assert sorted((r["system"], r["seed"]) for r in resumed) == sorted((s.name, 1) for s in claim.systems)
    assert all(r["epochs"] == 2 and r["updates"] > 0 and r["bleu_signature"].startswith("nrefs:1") for r in resumed)
    assert all(name in table for name in ("widenet_tiny", "multipath_transformer_tiny"))
    assert (tmp_path / "resumed" / "claim_tiny.png").stat().st_size > 0
    # each row keeps its curve, fairseq's validation loss after each epoch, the resumed epoch once
    assert [len(r["valid_curve"]) for r in resumed] == [2] * 2
    assert first["valid_curve"] == study.curve(interrupted, claim.systems[0])
    # Run again: everything is done, nothing trains, no row is added.
    logs = {p: p.stat().st_size for p in (tmp_path / "resumed").rglob("train.log")}
    _, again = run_study(multi30k_slice_bin, tmp_path / "resumed", results=kept)
    assert again == resumed
    assert {p: p.stat().st_size for p in logs} == logs
    # On another machine (a new work directory) the results file alone carries the study: nothing
    # trains, and the tables and figures come from its rows.
    table_elsewhere, elsewhere = run_study(multi30k_slice_bin, tmp_path / "elsewhere", results=kept)
    assert elsewhere == resumed and table_elsewhere == table
    assert not list((tmp_path / "elsewhere").rglob("train.log"))
    assert (tmp_path / "elsewhere" / "claim_tiny.png").stat().st_size > 0


def test_a_second_seed_only_where_the_design_is_within_1_bleu_of_a_baseline():
    claim = study.CLAIMS["multipath"]
    rows = [{"claim": "multipath", "seed": 1, "system": name, "bleu": bleu}
            for name, bleu in [("multi-path 3 x 4", 30.0), ("deep 12 x 1", 28.5), ("shallow 3 x 1", 27.0)]]
    assert study.close_claims(rows, [claim]) == []
    rows[1]["bleu"] = 29.2
    assert study.close_claims(rows, [claim]) == [claim]


@pytest.mark.slow
@pytest.mark.e2e
def test_the_scalable_path_trains_three_stages_and_scores_every_width(multi30k_bin, tmp_path):
    _, rows = run_study(multi30k_bin, tmp_path, max_epoch=1, claims="tiny_scalable")
    run = study.run_dir(tmp_path, TINY["tiny_scalable"], TINY["tiny_scalable"].systems[0], 1)
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
    assert len(study.curve(run, TINY["tiny_scalable"].systems[0])) == 3  # stages 1-3, an epoch each
    # each second counted once: a fine-tuned stage's clock starts where its parent's stopped
    clocks = [json.loads((run / f"stage{i}" / "training.json").read_text())["train_seconds"] for i in (1, 2, 3)]
    assert clocks == sorted(clocks)
    distillation = json.loads((run / "distilled.json").read_text())["seconds"]
    assert wide["train_seconds"] == pytest.approx(clocks[-1] + distillation, abs=0.1)
    # Interrupted after training, before its rows were written: scored again, no stage retrained.
    logs = {p: p.stat().st_size for p in run.rglob("train.log")}
    (tmp_path / "results.jsonl").unlink()
    _, again = run_study(multi30k_bin, tmp_path, max_epoch=1, claims="tiny_scalable")
    assert again == rows
    assert {p: p.stat().st_size for p in logs} == logs


def test_scalable_stages_2_and_3_train_table_4s_share_of_stage_1s_epochs(tmp_path, monkeypatch):
    """Stage 1 to convergence, then stages 2 and 3 for as many and half as many epochs (Table 4),
    not stopped by a validation loss that distillation raises."""
    stops = []

    def train(data, save, flags, stop, cpu):
        stops.append([str(f) for f in stop])
        return {"epochs": 7 if len(stops) == 1 else 0, "updates": 10, "train_seconds": 1.0}

    monkeypatch.setattr(runner, "fairseq_train", train)
    run = tmp_path / "run"
    run.mkdir()
    (run / "distilled.json").write_text('{"seconds": 1.0}')
    args = Namespace(data=tmp_path, max_epoch=40, patience=3, device="cpu")
    study.train_scalable(args, TINY["tiny_scalable"].systems[0], run, 1)
    assert [s[:2] for s in stops] == [["--max-epoch", "40"], ["--max-epoch", "7"], ["--max-epoch", "3"]]
    assert ["--patience" in s for s in stops] == [True, False, False]


def test_a_claim_already_holding_seed_2_rows_runs_its_missing_seed_2_runs_beside_seed_1(tmp_path, monkeypatch):
    """A rescored system (its rows at both seeds no longer done) retrains both seeds in one batch."""
    latent, multipath = study.CLAIMS["latent_depth"], study.CLAIMS["multipath"]
    results = study.Results(tmp_path / "results.jsonl")
    for seed in (1, 2):  # every system of the latent-depth claim but the first is done at both seeds
        results.add([{"claim": latent.name, "system": s.name, "seed": seed, "evaluate": s.evaluate}
                     for s in latent.systems[1:]])
    batches = []
    monkeypatch.setattr(study.runner, "run_jobs", lambda run, jobs, at_once: batches.append(list(jobs)))
    study.run_all(Namespace(jobs=2), results, study.first_runs(results, [latent, multipath]))
    assert sorted((c.name, s.name, seed) for c, s, seed in batches[0]) == sorted(
        [(latent.name, latent.systems[0].name, 1), (latent.name, latent.systems[0].name, 2)]
        + [(multipath.name, s.name, 1) for s in multipath.systems])


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
        study.run_all(Namespace(jobs=2), results, [(claim, 1)])
    recorded = study.Results(tmp_path / "results.jsonl")
    assert [recorded.done(claim, s, 1) for s in claim.systems] == [False, True, True]


def test_a_system_two_claims_share_trains_once(tmp_path, monkeypatch):
    trained = []

    def run_system(args, claim, system, seed):
        trained.append((claim.name, system.name))
        return [{"claim": claim.name, "system": system.name, "seed": seed, "bleu": 30.0}]

    monkeypatch.setattr(study, "run_system", run_system)
    results = study.Results(tmp_path / "results.jsonl")
    multipath, widenet = study.CLAIMS["multipath"], study.CLAIMS["widenet"]
    study.run_all(Namespace(jobs=1), results, [(multipath, 1), (widenet, 1)])
    # the stock 3 + 3 Transformer is multi-path's shallow baseline and WideNet's reference
    assert ("widenet", "unshared Transformer") not in trained and len(trained) == 6
    reference = next(r for r in results.rows if r["system"] == "unshared Transformer")
    assert reference == {"claim": "widenet", "system": "unshared Transformer", "seed": 1, "bleu": 30.0,
                         "same_run_as": "multipath: shallow 3 x 1"}
    # a different seed is a different run
    study.run_all(Namespace(jobs=1), results, [(widenet, 2)])
    assert ("widenet", "unshared Transformer") in trained


def validation_log(save, losses):
    """A fairseq-train log of ``save`` with these validation losses, one per epoch."""
    save.mkdir(parents=True)
    (save / "train.log").write_text("".join(
        f"2026-11-23 19:25:32 | INFO | valid | epoch {e:03d} | valid on 'valid' subset | loss {loss} | nll_loss 2.7 "
        f"| ppl 6.5 | num_updates {132 * e} | best_loss {loss}\n" for e, loss in enumerate(losses, 1)))


def test_progress_says_where_every_run_stands_from_its_logs_or_its_row(tmp_path):
    claims = [study.CLAIMS["partialformer"], TINY["tiny_scalable"]]
    partialformer, transformer = claims[0].systems
    validation_log(study.run_dir(tmp_path, claims[0], partialformer, 1), [5.1, 4.6, 4.7])
    scalable = study.run_dir(tmp_path, claims[1], claims[1].systems[0], 1)
    validation_log(scalable / "stage1", [5.0, 4.8])
    (scalable / "stage1" / "training.json").write_text("{}")
    validation_log(scalable / "stage2", [4.9])
    (scalable / "stage2" / "training.json").write_text("{}")
    validation_log(scalable / "stage3", [])  # started, no epoch validated yet
    # scored on another machine; the log here is of an abandoned try of the same run
    validation_log(study.run_dir(tmp_path, claims[0], transformer, 1), [5.3, 4.9])
    results = study.Results(tmp_path / "results.jsonl")
    results.add([{"claim": "multipath", "system": "shallow 3 x 1", "seed": 1, "bleu": 30.0, "valid_loss": 4.25},
                 {"claim": "partialformer", "system": "Transformer 4 + 4", "seed": 1, "bleu": 31.0,
                  "valid_loss": 4.2},
                 # seed 2 scored on another machine: no run directory here, still listed
                 {"claim": "partialformer", "system": "Transformer 4 + 4", "seed": 2, "bleu": 31.5,
                  "valid_loss": 4.19}])
    lines = study.progress(tmp_path, results, [*claims, study.CLAIMS["widenet"]]).splitlines()[2:]
    assert lines[:4] == ["| partialformer | PartialFormer | 1 | in progress, epochs 1-3 | 4.600 (2) |",
                         "| partialformer | Transformer 4 + 4 | 1 | scored | 4.200 (averaged) |",
                         "| partialformer | Transformer 4 + 4 | 2 | scored | 4.190 (averaged) |",
                         "| tiny_scalable | scalable_tiny | 1 | stage 1 trained, epochs 1-2; stage 2 trained, "
                         "epochs 1-1; stage 3 in progress, epoch 1 | stage 2 4.900 (1) |"]
    # the reference WideNet shares with multi-path, scored there, is not a run still to train
    assert lines[4:] == [f"| widenet | {name} | 1 | not started |  |"
                         for name in ("WideNet", "shared dense FFN", "shared LayerNorms")] + [
        "| widenet | unshared Transformer | 1 | scored as multipath: shallow 3 x 1 | 4.250 (averaged) |"]


def test_the_figure_draws_each_systems_curve_from_its_first_seed_that_recorded_one():
    claim = study.CLAIMS["scalable"]
    rows = [{"claim": "scalable", "system": "independent w64", "seed": 1},  # transcribed: no curve
            {"claim": "scalable", "system": "independent w64", "seed": 2, "valid_curve": [5.0, 4.5]},
            {"claim": "scalable", "system": "scalable w128", "seed": 2, "valid_curve": [4.9]},
            {"claim": "scalable", "system": "scalable w64", "seed": 1, "valid_curve": [5.1, 4.4]},
            {"claim": "multipath", "system": "independent w128", "seed": 1, "valid_curve": [9.0]}]
    assert study.curves(rows, claim) == {"scalable": (1, [5.1, 4.4]), "independent w64": (2, [5.0, 4.5])}


def test_tables_list_a_claims_systems_in_its_order_whatever_order_they_finished_in():
    rows = [{"claim": "scalable", "system": name, "seed": 1, "params": 1e6, "epochs": 3, "updates": 9,
             "train_seconds": 1.0, "valid_loss": 4.0, "bleu": 30.0}
            for name in ["independent w128", "scalable w128", "independent w64", "scalable w64"]]
    table = study.table(rows, study.CLAIMS["scalable"]).splitlines()[2:]
    assert [line.split(" | ")[0] for line in table] == [
        "| scalable w64", "| scalable w128", "| independent w64", "| independent w128"]


def test_the_kept_results_file_names_only_the_study_systems_and_carries_every_score():
    """docs/data/claims.jsonl feeds docs/claims.md across machines: a row the study cannot place
    (a renamed system) would be silently left out of its table and figure."""
    rows = study.Results(REPO / "docs" / "data" / "claims.jsonl").rows
    assert rows
    for r in rows:
        claim = study.CLAIMS[r["claim"]]
        assert study.system_and_width(r["system"], claim)[0] in {s.name for s in claim.systems}
        assert {"epochs", "updates", "params", "valid_loss", "bleu", "bleu_signature"} <= r.keys()
        assert r.get("valid_curve") or r.get("transcribed"), r["system"]
    assert len({(r["claim"], r["system"], r["seed"]) for r in rows}) == len(rows)  # each run once


def test_a_run_started_with_other_flags_is_not_resumed_under_new_ones(tmp_path):
    claim = TINY["tiny"]
    args, save = Namespace(device="cpu", max_epoch=1, patience=3), tmp_path / "run"
    runner.same_training(save, ["--arch", "widenet_tiny", "--finetune-from-model", tmp_path / "a" / "last.pt"])
    # the same flags in a moved work directory, or a raised --max-epoch, resume
    runner.same_training(save, ["--arch", "widenet_tiny", "--finetune-from-model", tmp_path / "b" / "last.pt"])
    with pytest.raises(ValueError, match="other flags"):
        study.fairseq_train(args, tmp_path, claim.systems[0].flags, save, 1)
    assert not (save / "train.log").exists()


@pytest.mark.slow
def test_a_latent_depth_row_names_the_layers_hard_selection_keeps(multi30k_bin, tmp_path):
    train(multi30k_bin, tmp_path, "latent_depth_transformer_tiny", max_update=1)  # LL-Both: 2 + 3 latent layers
    checkpoint = tmp_path / "checkpoint_last.pt"
    state = torch.load(checkpoint, weights_only=False)
    state["model"]["encoder.layer_select.logits"] = torch.tensor([[-1.0, 0.5]])
    state["model"]["decoder.layer_select.logits"] = torch.tensor([[2.0, -2.0, 3.0]])
    torch.save(state, checkpoint)
    assert study.latent_kept(checkpoint) == {"latent_kept": {"encoder.layer_select": [1],
                                                             "decoder.layer_select": [0, 2]}}


def test_a_row_scored_under_another_decoding_is_not_done_and_its_rescoring_replaces_it(tmp_path):
    """The LL-D rows were decoded with hard selection, a depth training never sampled;
    the study now decodes with the soft weights, so those rows are run again, and replaced."""
    claim = study.CLAIMS["latent_depth"]
    latent = claim.systems[0]
    assert latent.evaluate == {"latent_inference": "soft"}
    row = {"claim": claim.name, "system": latent.name, "seed": 1, "bleu": 37.0}
    results = study.Results(tmp_path / "claims.jsonl")
    results.add([{**row, "evaluate": {"latent_inference": "hard"}}])
    assert not results.done(claim, latent, 1)
    results.add([{**row, "bleu": 38.0, "evaluate": {"latent_inference": "soft"}}])
    assert results.done(claim, latent, 1)
    kept = study.Results(tmp_path / "claims.jsonl").rows
    assert [r["bleu"] for r in kept] == [38.0]
