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


# --- the released code's objective as --latent-objective anchor ---
anchor_loss = pytest.importorskip("fairseq.examples.latent_depth.latent_depth_src.loss.latent_depth")
SOFT, ANNEAL, BETA, LAMBDA, K = 300, 300, 0.1, 0.1, 3


def anchor_objective(samples, prior, num_updates, sample_sizes):
    """The released code's auxiliary loss for one update of one batch per pair (its task's train_step)."""
    args = Namespace(prior={"aggregated": "agged_posterior"}.get(prior, prior), sparsity_weight=BETA,
                     soft_update=SOFT, anneal_updates=ANNEAL, target_layers=K, share_weight=LAMBDA)
    per_pair = list(samples)
    kl = sum(anchor_loss.LatentLayersKLLoss(args)(per_pair, n, num_updates, size)
             for n, size in enumerate(sample_sizes))
    return kl + anchor_loss.LatentLayersSparsityLoss(args)(per_pair, num_updates, sum(sample_sizes))


def our_objective(samples, prior, num_updates, sample_sizes):
    """Ours under --latent-objective anchor on the same samples, one batch per pair: Σ_n size_n · aux_n."""
    crit = LatentDepthCriterion(SimpleNamespace(target_dictionary=dummy_dictionary(VOCAB)), False, 0.1,
                                latent_kl_weight=BETA, latent_kl_anneal_updates=ANNEAL, latent_prior=prior,
                                latent_target_layers=K, latent_depth_weight=LAMBDA, latent_objective="anchor")
    total = 0
    for n, size in enumerate(sample_sizes):
        extra = {"latent_probs_decoder": [torch.sigmoid(torch.zeros_like(samples))], "latent_samples_decoder": [samples],
                 "latent_num_updates": [torch.tensor(float(num_updates))],
                 "latent_soft_updates": [torch.tensor(float(SOFT))], "latent_pair": [torch.full((4,), n)]}
        total = total + size * crit.auxiliary(extra, torch.zeros(()))[0]
    return total


@pytest.mark.parametrize("num_updates", [100, 450, 700, 1000])  # KL weight < 0, KL ramp, L_K ramp, all on
@pytest.mark.parametrize("prior", ["uniform", "aggregated"])
@pytest.mark.parametrize("hard", [False, True], ids=["relaxed", "straight-through"])
def test_anchor_objective_equals_the_released_loss_modules(prior, num_updates, hard):
    g = torch.Generator().manual_seed(num_updates)
    soft = torch.rand(3, 6, generator=g).clamp(0.05, 0.95)
    values, grads = [], []
    for objective in (anchor_objective, our_objective):
        leaf = soft.clone().requires_grad_()
        samples = (leaf > 0.5).float() - leaf.detach() + leaf if hard else leaf  # as both sample
        loss = objective(samples, prior, num_updates, [1200, 900, 700])
        loss.backward()
        values.append(loss.item())
        grads.append(leaf.grad)
    assert values[0] == pytest.approx(values[1], rel=1e-5, abs=1e-4)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-4)
    assert grads[0].abs().sum() > 0


def test_anchor_objective_refuses_what_the_released_code_lacks():
    with pytest.raises(ValueError, match="--latent-prior uniform or aggregated"):
        LatentDepthCriterion(SimpleNamespace(target_dictionary=dummy_dictionary(VOCAB)), False, 0.1,
                             latent_prior="beta", latent_kl_anneal_updates=300, latent_objective="anchor")
