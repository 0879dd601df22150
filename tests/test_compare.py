"""The comparison's measurements (fairseq_widearch.experiments.compare)."""
import json
import os
import threading

import pytest

from fairseq_widearch.experiments import compare


def epoch_line(epoch, updates, wall):
    return (f"2026-11-22 14:40:56 | INFO | train | epoch {epoch:03d} | loss 9.402 | nll_loss 9.368 | ppl 661 | "
            f"wps 900 | ups 0.8 | wpb 1000 | bsz 280 | num_updates {updates} | lr 0.00014 | train_wall 17 | wall {wall}")


def test_updates_and_wall_time_are_read_from_every_stage():
    stage1 = "\n".join(["noise", epoch_line(1, 10, 21), epoch_line(2, 20, 40)])
    stage2 = "\n".join([epoch_line(1, 1, 3), epoch_line(2, 6, 9), "Stopping training due to num_updates: 6 >= 6"])
    assert compare.training_updates(stage1, stage2) == 20 + 6  # a later stage restarts its update count
    assert compare.training_wall_seconds(stage1, stage2) == 40 + 9
    resumed = "\n".join([stage1, "noise", epoch_line(3, 30, 12), epoch_line(4, 40, 25)])  # fairseq's clock restarts
    assert compare.training_wall_seconds(resumed) == 40 + 25
    assert not compare.cut_short(stage1, stage2)
    assert compare.cut_short(stage1, "Stopping training due to cumulative_training_time: 0.3 > stop_time_hours: 0.25")


def test_the_table_gives_mean_and_spread_over_seeds_and_the_side_by_side_speed():
    row = {"width": 0, "params": 3e6, "macs": 6e7, "max_update": 1320, "updates": 1320, "cut_short": False,
           "decode_sentences_per_s": 150.0, "bleu_signature": "nrefs:1"}
    rows = [{**row, "system": "transformer", "seed": 2, "bleu": 36.0, "train_wall_s": 900.0, "decode_sentences_per_s": 140.0},
            {**row, "system": "transformer", "seed": 1, "bleu": 35.0, "train_wall_s": 1200.0},
            {**row, "system": "widenet", "seed": 1, "bleu": 34.0, "train_wall_s": 800.0, "cut_short": True}]
    speeds = {"transformer": {"train_tokens_per_s": 5000.0, "train_flops_per_token": 1e7, "utilisation": 0.4}}
    summary = compare.summarise(rows, speeds)
    assert summary[0]["bleu"] == 35.5 and summary[0]["bleu_seeds"] == [35.0, 36.0] and summary[0]["seeds"] == [1, 2]
    lines = compare.table(summary).splitlines()
    assert lines[2] == ("| transformer | 3.00M | 60.0M | 1320 | 35.50 ± 0.71 (35.00, 36.00) | 5,000 | 40.0% | 150.0, 140.0 | "
                        "1200 s, 900 s |")
    assert lines[3].startswith("| widenet | 3.00M | 60.0M | 1320 (cut short by --minutes) | 34.00 (one seed) | "
                               "not measured | not measured |")


def test_every_missing_run_trains_once_on_the_device_asked_jobs_at_a_time(tmp_path, monkeypatch):
    row = {"width": 0, "params": 3e6, "macs": 6e7, "max_update": 1320, "updates": 1320, "cut_short": False,
           "decode_sentences_per_s": 150.0, "bleu_signature": "nrefs:1", "bleu": 35.0, "train_wall_s": 60.0}
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({**row, "system": "transformer", "seed": 1}) + "\n")
    calls, at_once, running = [], [], set()
    lock = threading.Lock()
    both_running = threading.Barrier(2, timeout=10)

    def run_system(args, name, seed):
        with lock:
            running.add((name, seed))
            at_once.append(len(running))
        if (name, seed) in {("transformer", 2), ("widenet", 1)}:
            both_running.wait()  # the first two jobs must run at the same time
        with lock:
            running.discard((name, seed))
            calls.append((name, seed, args.device))
        return [{**row, "system": name, "seed": seed}]

    monkeypatch.setattr(compare, "run_system", run_system)
    monkeypatch.setattr(compare, "matmul_peak_flops", lambda: 1e9)
    monkeypatch.setattr(compare, "side_by_side_throughput", lambda systems, data, peak: {
        name: {"train_tokens_per_s": 1.0, "train_flops_per_token": 1.0, "utilisation": 0.1} for name in systems})
    kept = {"partialformer": {"train_tokens_per_s": 2.0, "train_flops_per_token": 1.0, "utilisation": 0.2}}
    (tmp_path / "speeds.json").write_text(json.dumps(kept))
    compare.main(["--data", str(tmp_path), "--bpe-codes", "codes", "--ref", "ref", "--work-dir", str(tmp_path),
                  "--systems", "transformer,widenet", "--seeds", "1,2", "--device", "cuda", "--jobs", "2",
                  "--results", str(results), "--figure", str(tmp_path / "figure.png"),
                  "--throughput", str(tmp_path / "speeds.json")])
    assert sorted(calls) == [("transformer", 2, "cuda"), ("widenet", 1, "cuda"), ("widenet", 2, "cuda")]
    assert max(at_once) == 2
    assert len(results.read_text().splitlines()) == 4
    # the systems measured now are added to the throughput file; the speeds it held stay
    speeds = json.loads((tmp_path / "speeds.json").read_text())
    assert speeds["partialformer"] == kept["partialformer"] and speeds["widenet"]["matmul_peak_gflops"] == 1.0


@pytest.mark.parametrize("user_value, expected", [(None, "2"), ("3", "3")])
def test_runs_on_a_cpu_share_its_cores_unless_the_user_set_the_threads(tmp_path, monkeypatch, user_value, expected):
    monkeypatch.setenv("OMP_NUM_THREADS", "unset")  # recorded, so what compare sets is undone afterwards
    monkeypatch.delenv("OMP_NUM_THREADS")
    if user_value:
        monkeypatch.setenv("OMP_NUM_THREADS", user_value)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    threads = []

    def run_system(args, name, seed):
        threads.append(os.environ.get("OMP_NUM_THREADS"))  # what a training subprocess inherits
        return [{"system": name, "seed": seed, "width": 0, "params": 1, "macs": 1, "max_update": 1, "updates": 1,
                 "cut_short": False, "decode_sentences_per_s": 1.0, "bleu_signature": "s", "bleu": 1.0,
                 "train_wall_s": 1.0}]

    monkeypatch.setattr(compare, "run_system", run_system)
    (tmp_path / "throughput.json").write_text(json.dumps({"widenet": {
        "train_tokens_per_s": 1.0, "train_flops_per_token": 1.0, "utilisation": 0.1}}))
    compare.main(["--data", str(tmp_path), "--bpe-codes", "codes", "--ref", "ref", "--work-dir", str(tmp_path),
                  "--systems", "widenet", "--seeds", "1,2", "--jobs", "2", "--figure", str(tmp_path / "f.png")])
    assert threads == [expected, expected]


@pytest.mark.slow
def test_training_flops_per_token_count_forward_and_backward(multi30k_bin):
    from fairseq_widearch.experiments.counting import count_macs
    setup = compare.training_setup(["--arch", "partialformer_tiny"], str(multi30k_bin), batches=2)
    per_token = compare.training_flops_per_token(setup)
    forward = 2 * count_macs(setup[0], 20, 20) / 20  # FLOPs per target token of a 20 + 20 pair
    # backward costs about twice the forward; batch lengths differ from 20 + 20, hence the wide band
    assert 2 * forward < per_token < 5 * forward


@pytest.mark.slow
def test_side_by_side_throughput_times_every_system_in_one_process_without_checkpoints(multi30k_bin):
    """Each system built afresh from its training flags, the scalable model under its own task in stage 2."""
    systems = {"partialformer_tiny": ["--arch", "partialformer_tiny"],
               "scalable_transformer": compare.training_flags("scalable_transformer")}
    speeds = compare.side_by_side_throughput(systems, str(multi30k_bin), peak=1e6, batches=1, rounds=2)
    assert set(speeds) == set(systems)
    for speed in speeds.values():
        assert speed["train_tokens_per_s"] > 0 and speed["train_flops_per_token"] > 0
        flops_per_s = speed["train_flops_per_token"] * speed["train_tokens_per_s"]
        assert speed["utilisation"] == pytest.approx(flops_per_s / 1e6, rel=1e-3)
    # stage 2 trains every width of the scalable model: more FLOPs per token than its widest alone
    widest = compare.training_setup(compare.SYSTEMS["scalable_transformer"], str(multi30k_bin), batches=1)
    assert speeds["scalable_transformer"]["train_flops_per_token"] > compare.training_flops_per_token(widest)


def test_a_latent_depth_row_records_its_posterior_and_expected_depth():
    import torch

    from fairseq_widearch.experiments.compare import latent_posterior
    from fairseq_widearch.model_builder import build_model
    model = build_model("latent_depth_transformer_tiny", [], vocab_size=40)
    with torch.no_grad():
        model.decoder.layer_select.logits.copy_(torch.tensor([[2.0, 0.0, -2.0]]))
    posterior = latent_posterior(model)
    assert posterior["latent_q_decoder"] == [[0.8808, 0.5, 0.1192]]
    assert posterior["latent_expected_depth_decoder"] == 1.5 and posterior["latent_expected_depth_encoder"] == 1.0
    assert latent_posterior(build_model("transformer_tiny", [], vocab_size=40)) == {}


def test_a_finished_run_of_other_flags_is_refused_not_taken(tmp_path):
    """A run directory whose training finished under other flags (a system changed since) raises
    instead of handing back the old run as this one."""
    from fairseq_widearch.experiments import runner
    save = tmp_path / "run"
    runner.same_training(save, ["--arch", "a", "--latent-kl-weight", "1.0"])
    (save / "training.json").write_text(json.dumps({"epochs": 1, "updates": 10, "train_seconds": 1.0}))
    assert runner.fairseq_train("data", save, ["--arch", "a", "--latent-kl-weight", "1.0"])["updates"] == 10
    with pytest.raises(ValueError, match="started with other flags"):
        runner.fairseq_train("data", save, ["--arch", "a"])
