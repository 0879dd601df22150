"""Latent depth in its own regime (examples/latent_depth/depth_regime.py): the divergence verdict
fixed before the runs, a run's row, and Fig. 2's per-layer gradient norms."""
import json
import os
import threading
from argparse import Namespace

import pytest

import depth_regime  # noqa: E402  (examples/latent_depth, on the path testing_utils sets)
from testing_utils import cli


@pytest.mark.parametrize("curve, failed, verdict", [
    ([(25, 12.0), (200, 9.0), (1900, 5.0), (2000, 4.8)], False, ""),
    ([(25, 12.0), (200, 7.0), (1900, 7.1), (2000, 7.0)], False, "no progress after the first tenth"),
    ([(25, 12.0), (200, 9.0), (300, "nan")], False, "non-finite loss or gradient"),
    ([(25, 12.0), (200, 9.0)], True, "non-finite loss or gradient"),
])
def test_divergence_is_judged_by_the_rule_fixed_before_the_runs(curve, failed, verdict):
    assert depth_regime.divergence(curve, failed, 2000) == verdict


def test_the_loss_curve_reads_fairseqs_simple_log_nan_included():
    log = ("2026 | INFO | train_inner | epoch 001:     25 / 278 loss=13.311, nll_loss=13.28, ppl=9966.78, "
           "num_updates=25, lr=3e-05\n2026 | INFO | train_inner | epoch 001:     50 / 278 loss=nan, nll_loss=nan, "
           "num_updates=50, lr=6e-05\n")
    assert depth_regime.loss_curve(log) == [(25, 13.311), (50, "nan")]
    # killed after update 50, resumed from its checkpoint at 25: the resumed run's 50th update counts
    resumed = log + log.splitlines(keepends=True)[1].replace("loss=nan", "loss=12.5")
    assert depth_regime.loss_curve(resumed) == [(25, 13.311), (50, 12.5)]
    # a latent run's translation term alone, not the nll_loss or latent_kl beside it
    latent = ("2026 | INFO | train_inner | epoch 001:     25 / 832 loss=13.313, nll_loss=12.9, ce_loss=13.2, "
              "latent_kl=1.5, latent_depth_loss=2.06, ppl=9000, num_updates=25, lr=3e-05\n")
    assert depth_regime.loss_curve(latent) == [(25, 13.313)]
    assert depth_regime.loss_curve(latent, "ce_loss") == [(25, 13.2)]


def test_training_seconds_add_the_finished_invocations_of_a_resumed_run():
    log = ("| epoch 001 | loss 9 | num_updates 100 | wall 0\n| fairseq_cli.train | done training in 120.5 seconds\n"
           "| train_inner | epoch 001:  25 / 832 loss=9.1, num_updates=125, wall=0\n"  # killed here
           "| epoch 001 | loss 9 | num_updates 200 | wall 0\n| fairseq_cli.train | done training in 99.6 seconds\n")
    assert depth_regime.train_seconds(log) == 220


def test_the_next_run_starts_when_any_run_finishes_not_when_its_batch_does(monkeypatch, tmp_path):
    """Two at a time, three runs: the first waits for the third to start, which only a free slot
    left by the second allows (a batch of two would wait for the first: the guard's timeout)."""
    third_started = threading.Event()

    def run_one(args, system, seed):
        if system == "static_3":
            third_started.set()
        waited = third_started.wait(timeout=30) if system == "static_1" else True
        return {"system": system, "setting": "released", "seed": seed,
                "divergence": None if waited else "third never started"}

    monkeypatch.setattr(depth_regime, "run_one", run_one)
    monkeypatch.setattr(depth_regime, "prepare", lambda args: None)
    results = tmp_path / "rows.jsonl"
    depth_regime.run(Namespace(systems=["static_1", "static_2", "static_3"], seeds=[1], setting="released",
                               jobs=2, results=results, decode=True, max_update=2000))
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert rows[0]["system"] == "static_2" and len(rows) == 3  # each written as it finished
    assert all(r["divergence"] is None for r in rows)


def test_a_run_written_without_bleu_is_decoded_later_and_its_row_replaced(monkeypatch, tmp_path):
    """``--no-decode`` rows of finished runs are decoded by a later ``run`` (and only by one that
    decodes); a failed run (no posterior, no checkpoint) and a decoded one are not run again."""
    started = []

    def run_one(args, system, seed):
        started.append(system)
        return {"system": system, "setting": "released", "seed": seed, "divergence": None, "q_decoder": [],
                "bleu": {"static": {}}}

    monkeypatch.setattr(depth_regime, "run_one", run_one)
    monkeypatch.setattr(depth_regime, "prepare", lambda args: None)
    results = tmp_path / "rows.jsonl"
    written = [("static_1", {"q_decoder": []}), ("static_2", {"q_decoder": [], "bleu": {}}), ("static_3", {})]
    results.write_text("".join(json.dumps({"system": s, "setting": "released", "seed": 1, "max_update": 2000,
                                           **extra}) + "\n" for s, extra in written))
    systems = ["static_1", "static_2", "static_3"]
    depth_regime.run(Namespace(systems=systems, seeds=[1], setting="released", jobs=1, results=results, decode=False,
                               max_update=2000))
    assert started == []
    depth_regime.run(Namespace(systems=systems, seeds=[1], setting="released", jobs=1, results=results, decode=True,
                               max_update=2000))
    assert started == ["static_1"]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["system"] for r in rows] == ["static_2", "static_3", "static_1"]  # one row per run
    assert rows[-1]["bleu"] == {"static": {}}


def test_a_larger_max_update_runs_a_shorter_run_on_and_a_smaller_one_is_refused(monkeypatch, tmp_path):
    """A row of fewer updates than asked is not final: its run goes on (from its checkpoint, as
    fairseq-train does) and its new row replaces it; a row of more updates is never overwritten by a
    shorter budget's."""
    started = []

    def run_one(args, system, seed):
        started.append(system)
        return {"system": system, "setting": "released", "seed": seed, "max_update": args.max_update,
                "divergence": None, "q_decoder": []}

    monkeypatch.setattr(depth_regime, "run_one", run_one)
    monkeypatch.setattr(depth_regime, "prepare", lambda args: None)
    results = tmp_path / "rows.jsonl"
    results.write_text("".join(json.dumps({"system": s, "setting": "released", "seed": 1, "max_update": n,
                                           "q_decoder": []}) + "\n" for s, n in [("static_100", 1000), ("lld_100", 2000)]))
    args = dict(systems=["static_100", "lld_100"], seeds=[1], setting="released", jobs=1, results=results, decode=False)
    depth_regime.run(Namespace(**args, max_update=2000))
    assert started == ["static_100"]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["system"], r["max_update"]) for r in rows] == [("lld_100", 2000), ("static_100", 2000)]
    with pytest.raises(SystemExit, match=r"lld_100-released-1 \(2000\), static_100-released-1 \(2000\)"):
        depth_regime.run(Namespace(**args, max_update=1000))
    assert started == ["static_100"] and results.read_text().count("\n") == 2


@pytest.mark.slow
@pytest.mark.e2e
def test_a_run_writes_its_row_and_the_gradients_of_every_decoder_layer(multi30k_o2m_bin, tmp_path):
    """Both kinds of system train their updates post-norm; at initialisation the latent decoder's
    bottom layer gets a gradient over twice the static one's (Fig. 2's direction)."""
    common = ["--work-dir", tmp_path, "--data", multi30k_o2m_bin.parent, "--seeds", "1"]
    results, grads = tmp_path / "rows.jsonl", tmp_path / "grads.jsonl"
    proc = cli(depth_regime, "run", "--systems", "static_2,lld_2", "--max-update", "2", "--no-decode", "--results",
               results, *common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["system"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert sorted(rows) == ["lld_2", "static_2"] and all(r["updates"] == 2 for r in rows.values())
    assert len(rows["lld_2"]["q_decoder"]) == 3 and rows["static_2"]["q_decoder"] == []  # a posterior per pair
    assert [u for u, _ in rows["lld_2"]["ce_loss_curve"]] == [u for u, _ in rows["lld_2"]["loss_curve"]]
    assert "ce_loss_curve" not in rows["static_2"]
    log = (tmp_path / "train-lld_2-released-seed1.log").read_text()
    assert "decoder_normalize_before=False" in log or "'decoder_normalize_before': False" in log
    # the source's share of each last checkpoint's validation nll: another sentence's source changes it
    proc = cli(depth_regime, "sources", "--systems", "static_2,lld_2", *common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    use = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["system"] for r in use] == ["static_2", "lld_2"]
    assert all(0 < r["nll"] < 20 and r["nll_rolled"] != r["nll"] for r in use), use
    # 12 decoder layers: post-norm at 4 the static bottom layer's gradient is not yet starved
    proc = cli(depth_regime, "gradients", "--systems", "static_12,lld_12", "--updates", "0", "--gradients-results",
               grads, *common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    norms = {r["system"]: r["decoder_layer_grad_norms"] for r in map(json.loads, grads.read_text().splitlines())}
    assert len(norms["static_12"]) == len(norms["lld_12"]) == 12
    assert norms["lld_12"][0] > 2 * norms["static_12"][0] > 0
    png = tmp_path / "gradients.png"
    assert cli(depth_regime, "figure", "--gradients-results", grads, "--out", png).returncode == 0
    assert png.read_bytes().startswith(b"\x89PNG")


def test_a_cuda_run_trains_on_fairseqs_default_device_with_the_same_flags(tmp_path):
    def command(device):
        args = Namespace(setting="released", data=tmp_path, max_update=2000, work_dir=tmp_path, device=device)
        return depth_regime.train_command(args, "lld_24", 1, tmp_path)

    cpu, cuda = command("cpu"), command("cuda")
    assert "--cpu" in cpu and [c for c in cpu if c != "--cpu"] == cuda


@pytest.mark.parametrize("setting, parent, changed", [
    ("lr_div4", "released", {"--lr": "0.000375"}),
    ("dropout_01", "released", {"--dropout": "0.1", "--attention-dropout": "0.1"}),
    ("encoder_6", "released", {"--encoder-layers": "6"}), ("warmup_div8", "released", {"--warmup-updates": "125"}),
    ("dropout_01_lr_div2", "dropout_01", {"--lr": "0.00075"}),
])
@pytest.mark.parametrize("system", ["static_24", "lld_24"])
def test_each_setting_changes_one_thing_of_its_parent(tmp_path, system, setting, parent, changed):
    def flags(name):
        args = Namespace(setting=name, data=tmp_path, max_update=2000, work_dir=tmp_path, device="cpu")
        command = [str(c) for c in depth_regime.train_command(args, system, 1, tmp_path)]
        return {flag: value for flag, value in zip(command, command[1:] + [""]) if flag.startswith("--")}

    base, other = flags(parent), flags(setting)
    assert {flag for flag in base if base[flag] != other.get(flag)} == set(changed)
    assert {flag: other[flag] for flag in changed} == changed


def test_the_loss_curves_draw_one_panel_per_setting_and_refuse_a_file_without_the_systems(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"system": system, "setting": setting, "seed": 1, "diverged": diverged,
                                        "loss_curve": curve,
                                        **({"ce_loss_curve": [[25, 12.0], [50, 9.0]], "divergence_ce": None}
                                           if setting == "lr_x2" else {})}) + "\n"
                            for system, setting, diverged, curve in [
        ("static_100", "dropout_01", True, [[25, 12.0], [50, 11.0], [75, "nan"]]),
        ("lld_100", "dropout_01", False, [[25, 12.0], [50, 9.0]]),
        ("lld_100", "released", False, [[25, 12.0], [50, 9.5]]),
        ("lld_100", "lr_x2", True, [[25, 12.0], [50, 12.5]]),  # its whole loss diverged, not its translation term
        ("static_12", "released", False, [[25, 12.0]])]))
    png = tmp_path / "curves.png"
    depth_regime.main(["curves", "--results", str(rows), "--systems", "static_100,lld_100", "--out", str(png),
                       "--frequency-level", "8.96"])
    assert png.read_bytes().startswith(b"\x89PNG")
    from matplotlib import pyplot
    axes = pyplot.gcf().axes
    assert [ax.get_title() for ax in axes] == ["released", "lr_x2", "dropout_01"]  # SETTINGS' order
    markers = [[line.get_marker() for line in ax.lines] for ax in axes]
    assert "x" in markers[2] and "x" not in markers[1]  # static_100's nan; not lr_x2's whole loss
    colours = {}
    for ax in axes:
        for line in ax.lines:
            if not line.get_label().startswith("_"):
                colours.setdefault(line.get_label(), []).append(line.get_color())
    pyplot.close("all")
    assert set(colours) == {"lld_100", "static_100", "token frequencies only (an nll)"}
    assert len(colours["token frequencies only (an nll)"]) == 3  # in each panel
    assert len(colours["lld_100"]) == 3 and len(set(colours["lld_100"])) == 1  # one colour in every panel
    assert colours["lld_100"][0] != colours["static_100"][0]
    # a latent row's translation term, without the KL and depth terms its loss adds
    assert depth_regime.translation_curve({"loss_curve": [[25, 12.5]], "ce_loss_curve": [[25, 12.0]]}) == [[25, 12.0]]
    assert depth_regime.translation_curve({"loss_curve": [[25, 12.5]]}) == [[25, 12.5]]
    with pytest.raises(SystemExit, match="no rows of lld_24"):
        depth_regime.main(["curves", "--results", str(rows), "--systems", "lld_24", "--out", str(png)])


def test_the_gradients_figure_keeps_each_systems_colour_in_panels_that_lack_another(tmp_path):
    rows = tmp_path / "grads.jsonl"
    rows.write_text("".join(json.dumps({"system": system, "setting": "released", "seed": 1, "update": update,
                                        "decoder_layer_grad_norms": [0.01, 0.1, 1.0]}) + "\n"
                            for system, update in [("lld_3", 0), ("static_2", 0), ("static_3", 0), ("lld_3", 250),
                                                   ("static_3", 250)]))
    depth_regime.main(["figure", "--gradients-results", str(rows), "--out", str(tmp_path / "g.png")])
    from matplotlib import pyplot
    colours = {}
    for ax in pyplot.gcf().axes:
        for line in ax.lines:
            if not line.get_label().startswith("_"):
                colours.setdefault(line.get_label(), set()).add(line.get_color())
    pyplot.close("all")
    assert sorted(colours) == ["lld_3 released", "static_2 released", "static_3 released"]
    assert all(len(c) == 1 for c in colours.values()), colours


def test_every_pair_decodes_with_the_studys_length_limit_and_a_latent_model_soft(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(depth_regime, "generate", lambda *args, **kwargs: calls.append((args, kwargs)))
    monkeypatch.setattr(depth_regime, "corpus_bleu", lambda out, ref: (Namespace(score=12.345), "sig"))
    args = Namespace(data=tmp_path, device="cpu")
    scores = depth_regime.decode(args, "lld_24", tmp_path / "checkpoint_last.pt", tmp_path)
    assert scores == {"soft": {tgt: 12.35 for tgt in ("de", "fr", "cs")}}
    assert len(calls) == 3
    for positional, _ in calls:
        flags = [str(a) for a in positional]
        i = flags.index("--max-len-a")
        assert flags[i:i + 4] == ["--max-len-a", "1.5", "--max-len-b", "10"]
        assert flags[flags.index("--model-overrides") + 1] == repr({"latent_inference": "soft"})


def test_a_resumed_decode_keeps_only_whole_outputs_written_after_the_checkpoint(monkeypatch, tmp_path):
    """A run stopped while decoding resumes at its first unfinished pair, and never scores an output
    of an earlier state of its checkpoint."""
    calls = []
    monkeypatch.setattr(depth_regime, "generate", lambda data, ckpt, out, *a, **k: calls.append(out.name))
    monkeypatch.setattr(depth_regime, "corpus_bleu", lambda out, ref: (Namespace(score=1.0), "sig"))
    checkpoint = tmp_path / "checkpoint_last.pt"
    checkpoint.write_bytes(b"")
    whole = "S-0\tein Satz\nD-0\t-1.0\tein Satz\nGenerate test with beam=5: BLEU4 = 0.00\n"
    (tmp_path / "generate-static-en-de.txt").write_text(whole)                 # whole, after: kept
    (tmp_path / "generate-static-en-fr.txt").write_text(whole.rsplit("Gen", 1)[0])  # cut off: again
    (tmp_path / "generate-static-en-cs.txt").write_text(whole)                 # before the checkpoint: again
    os.utime(tmp_path / "generate-static-en-cs.txt", (0, 0))
    depth_regime.decode(Namespace(data=tmp_path, device="cpu"), "static_12", checkpoint, tmp_path)
    assert calls == ["generate-static-en-fr.txt", "generate-static-en-cs.txt"]


def test_the_table_averages_seeds_over_the_last_tenth_and_the_pairs_and_judges_gaps_by_the_spread(tmp_path, capsys):
    def row(system, seed, last, bleu, **extra):
        curve = [[200, 10.0], [1500, 9.0], [1900, last - 0.1], [2000, last + 0.1]]  # the last tenth: 1,801-2,000
        mode = "soft" if system.startswith("lld") else "static"
        return {"system": system, "setting": "dropout_01", "seed": seed, "max_update": 2000, "diverged": False,
                "loss_curve": curve, "bleu": {mode: {"de": bleu + 1, "fr": bleu, "cs": bleu - 1}}, **extra}
    rows = [row("static_6", 1, 6.0, 5.0), row("static_6", 2, 6.2, 6.0),
            row("lld_12", 1, 7.0, 4.8, ce_loss_curve=[[200, 10.0], [1900, 7.9], [2000, 8.1]], divergence_ce=None),
            row("lld_12", 2, 7.0, 5.1, ce_loss_curve=[[200, 10.0], [1900, 8.1], [2000, 8.3]], divergence_ce=None),
            row("static_6", 3, 1.0, 50.0) | {"setting": "released"}]
    results = tmp_path / "rows.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    depth_regime.main(["table", "--results", str(results), "--setting", "dropout_01", "--systems", "static_6,lld_12"])
    out = capsys.readouterr().out
    assert "| static_6 | 1,2 | trained, trained | 6.10 ± 0.14 (6.00-6.20, n = 2) | 6.50 ± 0.71" in out
    # a latent model's translation term, not its whole loss; its soft BLEU
    assert "| lld_12 | 1,2 | trained, trained | 8.10 ± 0.14 (8.00-8.20, n = 2) |" in out
    assert "mean BLEU +0.55 (spread 0.92): within the spread; loss over the last tenth -2.00 (spread 0.28): exceeds" in out
    undecoded = {k: v for k, v in rows[0].items() if k != "bleu"} | {"seed": 4}  # written with --no-decode
    results.write_text(results.read_text() + json.dumps(undecoded) + "\n")
    with pytest.raises(SystemExit, match="static_6 in dropout_01: no rows, or a row without BLEU"):
        depth_regime.main(["table", "--results", str(results), "--setting", "dropout_01", "--systems", "static_6"])
