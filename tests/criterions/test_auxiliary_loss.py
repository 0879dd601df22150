"""Criteria with auxiliary losses: training optimises the full objective, validation's ``loss`` is
the translation loss alone and each auxiliary term is logged beside it."""
import re
from types import SimpleNamespace

import pytest
import torch

from fairseq_widearch.criterions import LatentDepthCriterion, MoELabelSmoothedCrossEntropyCriterion
from fairseq_widearch.model_builder import build_model, dummy_dictionary
from testing_utils import train

VOCAB = 40
CASES = [("widenet_tiny", MoELabelSmoothedCrossEntropyCriterion, dict(moe_balance_weight=0.5), "moe_balance_loss"),
         ("latent_depth_transformer_tiny", LatentDepthCriterion,
          dict(latent_objective="ours", latent_kl_weight=2.0, latent_prior="beta", latent_prior_beta="1,3"), "latent_kl")]


def sample(seed=0):
    g = torch.Generator().manual_seed(seed)
    src, target = torch.randint(4, VOCAB, (3, 7), generator=g), torch.randint(4, VOCAB, (3, 6), generator=g)
    prev = torch.cat([torch.full((3, 1), 2), target[:, :-1]], dim=1)
    return {"net_input": {"src_tokens": src, "src_lengths": torch.full((3,), 7), "prev_output_tokens": prev},
            "target": target, "ntokens": target.numel()}


@pytest.mark.parametrize("arch,criterion_cls,weights,term", CASES)
def test_training_loss_is_the_full_objective_validation_loss_the_translation_loss(arch, criterion_cls, weights, term):
    torch.manual_seed(0)
    model = build_model(arch, ["--dropout", "0.1"], vocab_size=VOCAB)
    criterion = criterion_cls(SimpleNamespace(target_dictionary=dummy_dictionary(VOCAB)), False, 0.1, **weights)
    loss, sample_size, log = criterion(model.train(), sample())
    assert log[term] > 0 and loss > log["ce_loss"] + 1e-3  # the auxiliary term is in the training objective
    loss, _, log = criterion(model.eval(), sample())
    assert torch.equal(loss, log["ce_loss"]) and log[term] > 0  # validation: CE alone, the term logged beside


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["widenet_tiny"])
def test_validation_logs_the_translation_loss_as_loss(arch, multi30k_bin, tmp_path):
    log = train(multi30k_bin, tmp_path, arch, "--max-valid-steps", "3", "--moe-balance-weight", "1",
                max_update=1, validate=True).stdout
    valid = re.search(r"valid on 'valid' subset \| loss ([\d.]+) .*? \| ce_loss ([\d.]+) \| moe_balance_loss", log)
    train_line = re.search(r"\| train \| .*?loss ([\d.]+) .*? \| ce_loss ([\d.]+)", log)
    assert valid.group(1) == valid.group(2)
    assert float(train_line.group(1)) > float(train_line.group(2))
