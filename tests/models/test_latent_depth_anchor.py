"""latent_depth_transformer against the authors' released model: fairseq's own
``examples/latent_depth`` (shipped inside the installed fairseq), same body, same weights, same
layer selection -> the same log-probabilities (Li et al. 2020, Eq. 2)."""
import re
from argparse import Namespace
from types import SimpleNamespace

import pytest
import torch
from fairseq.models import FairseqEncoderDecoderModel
from fairseq.models.transformer import TransformerEncoder

from fairseq_widearch.criterions import LatentDepthCriterion
from fairseq_widearch.model_builder import build_model, dummy_dictionary, parse_arch_args

anchor = pytest.importorskip("fairseq.examples.latent_depth.latent_depth_src.models.latent_transformer")

VOCAB = 40
BODY = ["--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "4", "--encoder-layers", "2", "--decoder-layers", "3",
        "--dropout", "0", "--attention-dropout", "0"]
#: Our parameter name -> the anchor's; every other name is fairseq's own in both.
NAME_MAP = {"layer_select.logits": "layer_select.layer_logits"}
SELECTIONS = {"all on": [1.0, 1.0, 1.0], "0/1 pattern": [1.0, 0.0, 1.0], "soft weighting": [0.3, 0.85, 0.55]}


def anchor_name(ours: str) -> str:
    for old, new in NAME_MAP.items():
        ours = ours.replace(old, new)
    return ours


def padded_batch():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB, (3, 7), generator=g)
    src[0, :2] = 1  # left-padded source (fairseq's default)
    src[1, :1] = 1
    prev = torch.randint(4, VOCAB, (3, 6), generator=g)
    prev[:, 0] = 2
    prev[2, -2:] = 1  # right-padded target
    return src, torch.tensor([5, 6, 7]), prev


def build_pair(encoder_latent: bool):
    """(ours, anchor) with the same body and the weights of ours copied into the anchor."""
    d = dummy_dictionary(VOCAB)
    flags = BODY + (["--encoder-latent-layer"] if encoder_latent else [])
    ours = build_model("latent_depth_transformer", flags, src_dict=d).eval()
    args = parse_arch_args("latent_depth_transformer", flags)
    encoder_class = anchor.LatentTransformerEncoder if encoder_latent else TransformerEncoder
    encoder = encoder_class(args, d, torch.nn.Embedding(VOCAB, 32, padding_idx=d.pad()))
    decoder = anchor.LatentTransformerDecoder(args, d, torch.nn.Embedding(VOCAB, 32, padding_idx=d.pad()))
    theirs = FairseqEncoderDecoderModel(encoder, decoder).eval()
    for stack in ([encoder] if encoder_latent else []) + [decoder]:
        stack.set_lang_idx(0)
    missing, unexpected = theirs.load_state_dict({anchor_name(k): v for k, v in ours.state_dict().items()},
                                                 strict=False)
    # every layer of the anchor holds its stack's LayerSelect: the same tensor under each layer's name
    assert not unexpected and all(re.fullmatch(r"\w+\.layers\.\d+\.layer_select\.layer_logits", k) for k in missing)
    return ours, theirs


def fix_selection(ours, theirs, stack: str, z):
    """Both models weight layer l of ``stack`` by z[l] instead of sampling."""
    z = torch.tensor(z)
    getattr(ours, stack).layer_select.forward = lambda: z[None]
    getattr(theirs, stack).layer_select._gumbel_sigmoid = lambda logits, **kw: z


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("encoder_latent", [False, True], ids=["LL-D", "LL-Both"])
def test_same_log_probabilities_as_the_authors_model(encoder_latent, selection):
    torch.manual_seed(0)
    ours, theirs = build_pair(encoder_latent)
    fix_selection(ours, theirs, "decoder", SELECTIONS[selection])
    if encoder_latent:
        fix_selection(ours, theirs, "encoder", SELECTIONS[selection][::-1][:2])
    src, lengths, prev = padded_batch()
    with torch.no_grad():
        mine = ours.get_normalized_probs(ours(src, lengths, prev), log_probs=True)
        reference = theirs.get_normalized_probs(theirs(src, lengths, prev), log_probs=True)
    real = prev.ne(1)
    torch.testing.assert_close(mine[real], reference[real], atol=1e-5, rtol=0)
    assert not torch.allclose(mine[real], torch.log_softmax(torch.zeros_like(mine[real]), -1), atol=1e-2)


# --- the released code's objective: --latent-objective released ---
anchor_loss = pytest.importorskip("fairseq.examples.latent_depth.latent_depth_src.loss.latent_depth")
SOFT, ANNEAL, BETA, LAMBDA, K = 300, 300, 0.1, 0.1, 3
#: Before s (KL weight < 0), at s, inside the KL ramp, at s + a (L_K still off), just after it, inside
#: the L_K ramp, at its end (s + 2a) and after it.
SCHEDULE_POINTS = [100, 300, 450, 600, 601, 700, 900, 1000]


def released_loss(samples, prior, num_updates, sample_sizes):
    """The released code's auxiliary loss for one update of one batch per pair (its task's train_step),
    the batch of pair n holding ``sample_sizes[n]`` target tokens."""
    args = Namespace(prior={"aggregated": "agged_posterior"}.get(prior, prior), sparsity_weight=BETA,
                     soft_update=SOFT, anneal_updates=ANNEAL, target_layers=K, share_weight=LAMBDA)
    per_pair = list(samples)
    kl = sum(anchor_loss.LatentLayersKLLoss(args)(per_pair, n, num_updates, size)
             for n, size in enumerate(sample_sizes))
    return kl + anchor_loss.LatentLayersSparsityLoss(args)(per_pair, num_updates, sum(sample_sizes))


def released_criterion(**kw):
    return LatentDepthCriterion(SimpleNamespace(target_dictionary=dummy_dictionary(VOCAB)), False, 0.1,
                                **{**dict(latent_kl_weight=BETA, latent_kl_anneal_updates=ANNEAL, latent_target_layers=K,
                                          latent_depth_weight=LAMBDA, latent_objective="released"), **kw})


def batch_of(pairs, lengths):
    """Ours' view of one batch: each sentence's pair ``(B,)`` and a right-padded target of ``lengths`` tokens."""
    target = torch.full((len(lengths), max(lengths)), 1)  # pad = 1
    for row, n in enumerate(lengths):
        target[row, :n] = 5
    return torch.tensor(pairs), {"target": target}


def our_aux(crit, samples, num_updates, pair, sample):
    extra = {"latent_probs_decoder": [torch.sigmoid(torch.zeros_like(samples))], "latent_samples_decoder": [samples],
             "latent_num_updates": [torch.tensor(float(num_updates))],
             "latent_soft_updates": [torch.tensor(float(SOFT))], "latent_pair": [pair]}
    return crit.auxiliary(extra, torch.zeros(()), sample)[0]


def ours_per_pair_batches(samples, prior, num_updates, sample_sizes):
    """Ours on the same samples, one batch per pair as the released task takes them: Σ_n tokens_n · aux_n."""
    crit = released_criterion(latent_prior=prior)
    return sum(size * our_aux(crit, samples, num_updates, *batch_of([n] * 4, [size // 4] * 4))
               for n, size in enumerate(sample_sizes))


def ours_one_mixed_batch(samples, prior, num_updates, sample_sizes):
    """Ours on one batch holding every pair's sentences (as translation_multi_simple_epoch mixes them),
    shuffled, each pair's sentences of unequal lengths: tokens · aux."""
    pairs, lengths = [], []
    for n, size in enumerate(sample_sizes):
        pairs += [n] * 3
        lengths += [size // 2, size // 3, size - size // 2 - size // 3]
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(0)).tolist()
    pair, sample = batch_of([pairs[i] for i in order], [lengths[i] for i in order])
    return sum(sample_sizes) * our_aux(released_criterion(latent_prior=prior), samples, num_updates, pair, sample)


@pytest.mark.parametrize("ours", [ours_per_pair_batches, ours_one_mixed_batch], ids=["per-pair", "mixed"])
@pytest.mark.parametrize("num_updates", SCHEDULE_POINTS)
@pytest.mark.parametrize("prior", ["uniform", "aggregated"])
@pytest.mark.parametrize("hard", [False, True], ids=["relaxed", "straight-through"])
def test_released_objective_equals_the_released_loss_modules(prior, num_updates, hard, ours):
    g = torch.Generator().manual_seed(num_updates)
    soft = torch.rand(3, 6, generator=g).clamp(0.05, 0.95)
    values, grads = [], []
    for objective in (released_loss, ours):
        leaf = soft.clone().requires_grad_()
        samples = (leaf > 0.5).float() - leaf.detach() + leaf if hard else leaf  # as both sample
        loss = objective(samples, prior, num_updates, [1200, 900, 600])  # the pairs' target tokens
        loss.backward()
        values.append(loss.item())
        grads.append(leaf.grad)
    assert values[0] == pytest.approx(values[1], rel=1e-5, abs=1e-4)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-4)
    assert (grads[0].abs().sum() > 0) == (num_updates != SOFT)  # at s the KL weight is 0 and L_K is off


def test_an_all_zero_aggregate_takes_the_uniform_prior_over_layers_where_the_released_loss_is_nan():
    zeros = torch.zeros(3, 6, requires_grad=True)
    assert torch.isnan(released_loss(zeros, "aggregated", 450, [8, 8, 8]))
    pair, sample = batch_of([0, 1, 2], [8, 8, 8])
    ours = our_aux(released_criterion(latent_prior="aggregated"), zeros, 450, pair, sample)
    ours.backward()
    # inside the KL ramp (weight 0.05, L_K off), each pair a third of the tokens, p_l = 1/6:
    # d/dz [z (log(z + ε) − log(p + ε)) / L] at z = 0 is (log ε − log(1/6 + ε)) / 6
    eps = torch.tensor(1e-7)
    expected = 0.05 / 3 * (eps.log() - (1 / 6 + eps).log()) / 6
    assert ours.item() == 0.0
    torch.testing.assert_close(zeros.grad, expected.expand(3, 6))


def test_with_sentence_avg_each_pair_is_weighted_by_its_sentences_as_the_released_task_weights_it():
    samples = torch.rand(3, 6, generator=torch.Generator().manual_seed(0)).clamp(0.05, 0.95)
    pair, sample = batch_of([0, 2, 0, 1, 2, 2], [9, 2, 4, 7, 3, 5])  # 2, 1 and 3 sentences
    crit = released_criterion(latent_prior="aggregated")
    crit.sentence_avg = True
    ours = 6 * our_aux(crit, samples, 700, pair, sample)
    assert ours.item() == pytest.approx(released_loss(samples, "aggregated", 700, [2, 1, 3]).item(), rel=1e-5)


@pytest.mark.parametrize("kw,message", [
    (dict(latent_prior="beta"), "--latent-prior uniform or aggregated"),
    (dict(latent_utilization="probs"), "--latent-utilization probs is Eq. 8's option"),
    (dict(latent_target_layers=None), "needs --latent-target-layers K"),
    (dict(latent_kl_anneal_updates=None), "needs --latent-kl-anneal-updates > 0"),
    (dict(latent_kl_anneal_updates=0), "needs --latent-kl-anneal-updates > 0"),
])
def test_released_objective_refuses_what_the_released_code_lacks(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        released_criterion(**kw)
