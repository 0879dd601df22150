"""python -m fairseq_widearch.cli.prune_latent_layers: a stock transformer that stock fairseq
loads without the plugin and that translates exactly like the hard-selected latent model."""

import pytest
import torch

from testing_utils import REPO, cli, fairseq_cli, run, train


@pytest.fixture(scope="module")
def latent_checkpoint(multi30k_bin, tmp_path_factory):
    """A trained tiny LL-Both model whose posteriors deselect decoder layer 1."""
    save = tmp_path_factory.mktemp("latent")
    train(multi30k_bin, save, "latent_depth_transformer_tiny", max_update=3)
    state = torch.load(save / "checkpoint_last.pt")
    state["model"]["encoder.layer_select.logits"][0] = torch.tensor([3.0, 3.0])
    state["model"]["decoder.layer_select.logits"][0] = torch.tensor([3.0, -3.0, 3.0])
    torch.save(state, save / "forced.pt")
    return save / "forced.pt"


def prune(checkpoint, out, *extra):
    return cli("fairseq_widearch.cli.prune_latent_layers", "--checkpoint", checkpoint, "--out", out, *extra)


def hypotheses(data, checkpoint, *extra):
    out = run([fairseq_cli("generate"), data, "--path", checkpoint, "--gen-subset", "valid", "--beam", "3",
               "--max-len-b", "10", "--cpu", "--batch-size", "64", "--num-shards", "8", "--shard-id", "0",
               # stock fairseq (no plugin) would drop the last batch (README, fairseq fixes)
               "--required-batch-size-multiple", "1", *extra], cwd=REPO.parent).stdout
    return sorted(line for line in out.splitlines() if line.startswith("H-"))


@pytest.mark.slow
@pytest.mark.e2e
def test_pruned_model_decodes_without_the_plugin_like_hard_selection(latent_checkpoint, multi30k_bin, tmp_path):
    pruned = tmp_path / "pruned.pt"
    proc = prune(latent_checkpoint, pruned)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "decoder layers [0, 2]" in proc.stdout and "warning" not in proc.stderr  # q = 0.95 / 0.05
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(pruned)) == []
    plain = hypotheses(multi30k_bin, pruned)  # stock fairseq, no --user-dir
    latent = hypotheses(multi30k_bin, latent_checkpoint, "--user-dir", REPO / "fairseq_widearch",
                        "--model-overrides", "{'latent_inference': 'hard'}")
    assert len(plain) > 100 and plain == latent  # one eighth of the valid set


@pytest.mark.slow
def test_warns_when_pruning_a_posterior_that_is_not_near_discrete(latent_checkpoint, tmp_path):
    state = torch.load(latent_checkpoint)
    state["model"]["decoder.layer_select.logits"][0] = torch.tensor([3.0, -3.0, 0.3])  # q = 0.574: undecided
    torch.save(state, tmp_path / "undecided.pt")
    proc = prune(tmp_path / "undecided.pt", tmp_path / "pruned.pt")
    assert proc.returncode == 0 and "decoder layers [0, 2]" in proc.stdout
    assert "warning" in proc.stderr and "decoder: hard latent layer selection" in proc.stderr
    assert "1 of 3 q(z = 1)" in proc.stderr and "encoder" not in proc.stderr


@pytest.mark.slow
def test_clear_errors(latent_checkpoint, multi30k_bin, tmp_path):
    proc = prune(latent_checkpoint, tmp_path / "x.pt", "--threshold", "0.99")
    assert proc.returncode != 0 and "no encoder layer has q(z = 1) > 0.99" in proc.stderr
    state = torch.load(latent_checkpoint)
    state["cfg"]["model"].decoder_normalize_before = False
    torch.save(state, tmp_path / "post_norm.pt")
    proc = prune(tmp_path / "post_norm.pt", tmp_path / "z.pt")
    assert proc.returncode != 0 and "the decoder is post-norm" in proc.stderr and not (tmp_path / "z.pt").exists()
    other = tmp_path / "transformer"
    train(multi30k_bin, other, "transformer_tiny", max_update=1)
    proc = prune(other / "checkpoint_last.pt", tmp_path / "y.pt")
    assert proc.returncode != 0 and "holds a 'transformer_tiny' model, not a latent_depth_transformer" in proc.stderr
