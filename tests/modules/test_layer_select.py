"""LayerSelect (Li et al. 2020, Eqs. 2 and 5)."""
import math

import pytest
import torch

from fairseq_widearch.modules import LayerSelect
from fairseq_widearch.modules.layer_select import expected_relaxed_sample, logistic_noise


def test_gumbel_sigmoid_selects_a_layer_with_its_posterior_probability():
    """z > 0.5 exactly when α + logistic noise > 0, which has probability σ(α) at any τ."""
    torch.manual_seed(0)
    select = LayerSelect(3, logit_init=0.0, temperature=2.0).train()
    with torch.no_grad():
        select.logits[0] = torch.tensor([math.log(4.0), 0.0, -math.log(9.0)])  # σ = 0.8, 0.5, 0.1
    samples = torch.cat([select() for _ in range(20000)])
    assert ((samples > 0) & (samples < 1)).all()  # soft samples in training
    torch.testing.assert_close((samples > 0.5).float().mean(0), torch.tensor([0.8, 0.5, 0.1]), atol=0.015, rtol=0)


def test_inference_is_deterministic_soft_or_hard():
    select = LayerSelect(3).eval()
    with torch.no_grad():
        select.logits[0] = torch.tensor([2.0, -0.1, 0.3])
    torch.testing.assert_close(select(), expected_relaxed_sample(select.logits, 5.0))  # mean of training's z
    assert torch.equal(select(), select())
    select.soft_updates = 0  # training draws straight-through hard samples: their mean is σ(α)
    torch.testing.assert_close(select(), torch.sigmoid(select.logits))
    select.inference = "hard"
    assert select().tolist() == [[1.0, 0.0, 1.0]]


def test_hard_selection_warns_once_when_the_posterior_is_not_near_discrete(caplog):
    """The paper prunes once q is near-discrete; a layer at q = 0.57 is kept by chance, and the
    user is told so (once: the check is a host sync)."""
    decided, undecided = LayerSelect(3, inference="hard").eval(), LayerSelect(3, inference="hard").eval()
    with torch.no_grad():
        decided.logits[0] = torch.tensor([3.0, -3.0, 4.0])  # q = 0.95, 0.05, 0.98
        undecided.logits[0] = torch.tensor([3.0, -3.0, 0.3])  # q = 0.95, 0.05, 0.57
    with caplog.at_level("WARNING", logger="fairseq_widearch.modules.layer_select"):
        assert decided().tolist() == [[1.0, 0.0, 1.0]]
        assert not caplog.records
        assert undecided().tolist() == undecided().tolist() == [[1.0, 0.0, 1.0]]
    assert len(caplog.records) == 1
    assert "1 of 3 q(z = 1) lie in (0.1, 0.9)" in caplog.text and "0.574" in caplog.text


def test_straight_through_hard_samples_after_soft_updates():
    torch.manual_seed(0)
    select = LayerSelect(4, soft_updates=10).train()
    select.set_num_updates(9)
    z_soft = select()
    assert ((z_soft > 0) & (z_soft < 1)).all()
    select.set_num_updates(10)
    z = select()
    assert set(z.flatten().tolist()) <= {0.0, 1.0}
    z.sum().backward()
    assert select.logits.grad.abs().sum() > 0  # the soft sample's gradient


def test_temperature_anneals_exponentially_through_set_num_updates():
    select = LayerSelect(2, temperature=5.0, min_temperature=0.5, temperature_anneal_updates=100)
    assert select.current_temperature() == 5.0
    select.set_num_updates(50)
    assert select.current_temperature() == pytest.approx(math.sqrt(5.0 * 0.5))
    select.set_num_updates(1000)
    assert select.current_temperature() == pytest.approx(0.5)


def test_one_posterior_per_language_pair_and_each_sentence_gets_its_pairs_sample():
    torch.manual_seed(0)
    select = LayerSelect(2, num_posteriors=3).eval()
    with torch.no_grad():
        select.logits[2] = torch.tensor([5.0, -5.0])
    z = select()
    assert z[2].tolist() == pytest.approx(expected_relaxed_sample(torch.tensor([5.0, -5.0]), 5.0).tolist())
    assert z[0].tolist() == [0.5, 0.5]
    select.train()
    z = select()
    assert len(set(z[:, 0].tolist())) == 3  # one independent sample per pair
    pair = torch.tensor([2, 0, 2, 1])
    weights = select.layer_weights(z, pair)  # (L, B, 1)
    assert weights.shape == (2, 4, 1)
    assert torch.equal(weights[:, :, 0], z[pair].t())
    assert torch.equal(select.layer_weights(z), z[0])  # bilingual: one weight per layer


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=0.0), "temperature and min_temperature must be > 0"),
    (dict(inference="sample"), "inference must be one of"),
    (dict(threshold=1.0), "threshold must be in \\(0, 1\\)"),
])
def test_invalid_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LayerSelect(3, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,soft_updates", [(5.0, -1), (1.0, -1), (5.0, 0)])
def test_soft_inference_weights_are_the_mean_of_the_training_samples(temperature, soft_updates):
    """Monte-Carlo: the mean of 200,000 training draws of z (relaxed Gumbel-sigmoid samples at τ,
    or straight-through hard ones) equals the deterministic soft inference weight."""
    logits = torch.tensor([0.0, 2.0, 4.0, -3.0])
    select = LayerSelect(4, num_posteriors=200_000, temperature=temperature, soft_updates=soft_updates)
    with torch.no_grad():
        select.logits.copy_(logits.expand(200_000, 4))
    torch.manual_seed(0)
    monte_carlo = select.train()().mean(0)
    soft = select.eval()()[0]
    torch.testing.assert_close(soft, monte_carlo, atol=4e-3, rtol=0)
    if soft_updates < 0:  # relaxed samples: σ(α) is not their mean (0.881 against 0.596 at α = 2, τ = 5)
        assert (soft[1:] - torch.sigmoid(logits[1:])).abs().min() > 0.03


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_model_samples_and_probs_in_fp32(dtype):
    """A model cast to fp16 (fairseq's --fp16) keeps the Gumbel-sigmoid and q = σ(α) in fp32: fp16
    uniforms are exactly 0 once in 2,048 draws, so two of them in one sample give −inf + inf = NaN
    (about one in 4M samples, here 4M per draw), and σ(8) rounds to 1 in fp16."""
    torch.manual_seed(0)
    select = LayerSelect(num_layers=1024, num_posteriors=4096).to(dtype).train()
    for _ in range(3):
        z = select()
        assert z.dtype == torch.float32 and torch.isfinite(z).all()
    with torch.no_grad():
        select.logits.fill_(8.0)
    assert select.probs().dtype == torch.float32 and (select.probs() < 1).all()


def test_sampled_inference_draws_each_sentences_layers_as_training_does():
    torch.manual_seed(0)
    select = LayerSelect(3, soft_updates=5, inference="sampled").eval()
    with torch.no_grad():
        select.logits[0] = torch.tensor([math.log(4.0), 0.0, -math.log(9.0)])  # σ = 0.8, 0.5, 0.1
    assert select.per_sentence() and not select.train().per_sentence()
    select.eval()
    noise = logistic_noise(20000, 3)
    relaxed = select.sentence_samples(noise)  # before --latent-soft-updates: relaxed samples at τ
    assert ((relaxed > 0) & (relaxed < 1)).all()
    torch.testing.assert_close(relaxed.mean(0), expected_relaxed_sample(select.logits[0], 5.0), atol=0.01, rtol=0)
    select.set_num_updates(5)  # then straight-through hard samples: z_l = 1 with probability σ(α_l)
    hard = select.sentence_samples(noise)
    assert set(hard.flatten().tolist()) == {0.0, 1.0}
    torch.testing.assert_close(hard.mean(0), torch.tensor([0.8, 0.5, 0.1]), atol=0.015, rtol=0)
    pairs = LayerSelect(2, num_posteriors=2, soft_updates=0, inference="sampled").eval()
    with torch.no_grad():
        pairs.logits.copy_(torch.tensor([[9.0, 9.0], [-9.0, -9.0]]))
    assert pairs.sentence_samples(logistic_noise(3, 2), torch.tensor([1, 0, 1])).tolist() == [[0, 0], [1, 1], [0, 0]]
