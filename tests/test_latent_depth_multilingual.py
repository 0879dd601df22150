"""Multilingual latent depth on fairseq's translation_multi_simple_epoch (one-to-many Multi30k):
one posterior per language pair, the aggregated-posterior prior, pruning for one pair."""

import pytest
import torch

from testing_utils import REPO, cli, fairseq_cli, run, train

PAIRS = ["--task", "translation_multi_simple_epoch", "--lang-pairs", "en-de,en-fr,en-cs", "--decoder-langtok"]


def hypotheses(data, checkpoint, *extra):
    out = run([fairseq_cli("generate"), data, "--path", checkpoint, *PAIRS, "--encoder-langtok", "tgt",
               "--source-lang", "en", "--target-lang", "fr", "--gen-subset", "valid", "--beam", "3",
               "--max-len-b", "10", "--cpu", "--batch-size", "64", "--num-shards", "8", "--shard-id", "0",
               # stock fairseq (no plugin) would drop the last batch (README, fairseq fixes)
               "--required-batch-size-multiple", "1", *extra],
              cwd=REPO.parent).stdout
    return sorted(line for line in out.splitlines() if line.startswith("H-"))


@pytest.fixture(scope="module")
def trained(multi30k_o2m_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("latent_o2m")
    log = train(multi30k_o2m_bin, save, "latent_depth_transformer_tiny", *PAIRS, "--encoder-langtok", "tgt",
                "--criterion", "latent_depth_label_smoothed_cross_entropy", "--latent-prior", "aggregated",
                "--latent-target-layers", "2", "--save-interval-updates", "1", "--keep-interval-updates", "-1",
                max_update=3).stdout
    return save / "checkpoint_last.pt", log


@pytest.mark.slow
def test_one_posterior_per_pair_trained_with_the_aggregated_prior(trained):
    checkpoint, log = trained
    state = torch.load(checkpoint)
    assert state["model"]["decoder.layer_select.logits"].shape == (3, 3)  # 3 pairs x 3 decoder layers
    assert state["cfg"]["model"].latent_pair_langtoks == "__de__,__fr__,__cs__"
    line = [ln for ln in log.splitlines() if "| train |" in ln][-1]
    assert "latent_kl " in line and "latent_depth_decoder " in line, line


@pytest.mark.slow
@pytest.mark.e2e
def test_pruned_for_one_pair_decodes_without_the_plugin_like_hard_selection(trained, multi30k_o2m_bin, tmp_path):
    checkpoint, _ = trained
    state = torch.load(checkpoint)
    state["model"]["encoder.layer_select.logits"] = torch.tensor([[3.0, 3.0], [3.0, -3.0], [-3.0, 3.0]])
    state["model"]["decoder.layer_select.logits"] = torch.tensor([[3.0] * 3, [-3.0, 3.0, 3.0], [3.0] * 3])
    forced = tmp_path / "forced.pt"
    torch.save(state, forced)
    proc = cli("fairseq_widearch.cli.prune_latent_layers", "--checkpoint", forced, "--out", tmp_path / "x.pt")
    assert proc.returncode != 0 and "choose one of ['en-de', 'en-fr', 'en-cs'] with --lang-pair" in proc.stderr
    proc = cli("fairseq_widearch.cli.prune_latent_layers", "--checkpoint", forced, "--out", tmp_path / "en-fr.pt",
               "--lang-pair", "en-fr")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "encoder layers [0] and decoder layers [1, 2]" in proc.stdout
    plain = hypotheses(multi30k_o2m_bin, tmp_path / "en-fr.pt")  # stock fairseq, no --user-dir
    latent = hypotheses(multi30k_o2m_bin, forced, "--user-dir", REPO / "fairseq_widearch",
                        "--model-overrides", "{'latent_inference': 'hard'}")
    assert len(plain) > 100 and plain == latent


@pytest.mark.slow
def test_language_tokens_that_cannot_tell_the_pairs_apart_fail_naming_the_flag(multi30k_o2m_bin, tmp_path):
    with pytest.raises(AssertionError, match="fairseq-train: error: --encoder-langtok src gives the language pairs"):
        train(multi30k_o2m_bin, tmp_path, "latent_depth_transformer_tiny", *PAIRS, "--encoder-langtok", "src")
    with pytest.raises(AssertionError, match="fairseq-train: error: .*set --encoder-langtok"):
        train(multi30k_o2m_bin, tmp_path, "latent_depth_transformer_tiny", *PAIRS)


@pytest.mark.slow
def test_layer_utilization_plot_from_checkpoints(trained, tmp_path):
    checkpoint, _ = trained
    out = tmp_path / "u.png"
    proc = cli("fairseq_widearch.cli.plot_layer_utilization", checkpoint.parent, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "3 checkpoints (1 to 3 updates)" in proc.stdout  # checkpoint_last repeats update 3
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    logits = torch.load(checkpoint)["model"]["decoder.layer_select.logits"]
    expected = " ".join(f"{v:.3f}" for v in torch.sigmoid(logits[1]).tolist())
    assert f"decoder en-fr: u_l after 3 updates = {expected}" in proc.stdout
