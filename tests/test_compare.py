"""The comparison's measurements (examples/compare/compare.py)."""
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "examples" / "compare"))
import compare  # noqa: E402


def epoch_line(epoch, wps, wpb, updates):
    return (f"2026-11-22 14:40:56 | INFO | train | epoch {epoch:03d} | loss 9.402 | nll_loss 9.368 | ppl 661 | "
            f"wps {wps} | ups 0.8 | wpb {wpb} | bsz 280 | num_updates {updates} | lr 0.00014 | train_wall 17 | wall 21")


def test_training_tokens_per_second_weighs_epochs_by_their_time():
    stage1 = "\n".join(["noise", epoch_line(1, 500, 1000, 10), epoch_line(2, 1000, 2000, 20)])
    # epoch 1: 10,000 tokens in 20 s; epoch 2: 20,000 tokens in 20 s
    assert compare.training_tokens_per_s(stage1) == pytest.approx(30000 / 40)
    # a second log (a later stage) restarts its update count; a one-update epoch (wps 0) is left out
    stage2 = "\n".join([epoch_line(1, 0, 4000, 1), epoch_line(2, 250, 1000, 6)])
    assert compare.training_tokens_per_s(stage1, stage2) == pytest.approx((30000 + 5000) / (40 + 20))
    assert compare.training_updates(stage1, stage2) == 20 + 6


def test_a_log_without_epoch_summaries_is_an_error():
    with pytest.raises(ValueError, match="no '| train | epoch' summary"):
        compare.training_tokens_per_s("| INFO | fairseq_cli.train | training on 1 devices")


def test_training_flops_per_token_count_forward_and_backward(tiny_checkpoint, multi30k_bin):
    from fairseq_widearch.cli.stats import count_macs
    from fairseq import checkpoint_utils
    checkpoint = tiny_checkpoint("partialformer_tiny") / "checkpoint_last.pt"
    per_token = compare.training_flops_per_token(checkpoint, str(multi30k_bin), batches=2)
    [model], _ = checkpoint_utils.load_model_ensemble([str(checkpoint)], arg_overrides={"data": str(multi30k_bin)})
    forward = 2 * count_macs(model, 20, 20) / 20  # FLOPs per target token of a 20 + 20 pair
    # backward costs about twice the forward; batch lengths differ from 20 + 20, hence the wide band
    assert 2 * forward < per_token < 5 * forward
