"""latent_depth_transformer against the authors' released model: fairseq's own
``examples/latent_depth`` (shipped inside the installed fairseq), same body, same weights, same
layer selection -> the same log-probabilities (Li et al. 2020, Eq. 2)."""
import re

import pytest
import torch
from fairseq.models import FairseqEncoderDecoderModel
from fairseq.models.transformer import TransformerEncoder

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
