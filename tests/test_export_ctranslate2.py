"""python -m fairseq_widearch.cli.export_ctranslate2: CTranslate2 models of the standard
Transformers the plugin's designs end in (pruned latent depth, scalable sub-Transformer exports),
scored token by token against the fairseq model they came from; every other model refused, saying
why. Translations of Multi30k-trained checkpoints: tests/test_deploy.py."""
from types import SimpleNamespace

import pytest
import torch

from fairseq_widearch.cli.export_ctranslate2 import build_spec, refusal
from fairseq_widearch.model_builder import build_model, dummy_dictionary
from testing_utils import VARIANTS, parent_and_export

ctranslate2 = pytest.importorskip("ctranslate2")
VOCAB = 40
DICT = dummy_dictionary(VOCAB)


def converted(model, tmp_path):
    spec = build_spec(model, model.cfg, DICT, DICT)

    class Converter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    return ctranslate2.Translator(Converter().convert(str(tmp_path / "ct2"), force=True))


def fairseq_log_probs(model, src, tgt):
    """log p(tgt_t | tgt_<t, src) of each target token and the final </s>, as fairseq scores them."""
    eos = DICT.eos()
    src_tokens = torch.tensor([[*src, eos]])
    prev = torch.tensor([[eos, *tgt]])
    with torch.no_grad():
        lp = model.get_normalized_probs(model(src_tokens, torch.tensor([len(src) + 1]), prev), log_probs=True)[0]
    return [lp[i, t].item() for i, t in enumerate([*tgt, eos])]


def assert_same_scores(model, tmp_path):
    translator = converted(model.eval(), tmp_path)
    g = torch.Generator().manual_seed(1)
    for length in (3, 9):
        src = torch.randint(4, VOCAB, (length,), generator=g).tolist()
        tgt = torch.randint(4, VOCAB, (length + 2,), generator=g).tolist()
        scored = translator.score_batch([[DICT[i] for i in src]], [[DICT[i] for i in tgt]])[0].log_probs
        torch.testing.assert_close(torch.tensor(scored), torch.tensor(fairseq_log_probs(model, src, tgt)),
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("sub_transformer", ["type-1 C=64", "type-2 D=64 at C=128"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_scalable_exports_score_as_in_fairseq(variant, sub_transformer, tmp_path):
    """With W'_e, W'_o (Eqs. 3-5) or I/O-cropped, post- or pre-norm; one attention width D in all
    layers (D / 64 heads of 64 at a model width C that need not be D)."""
    _, exported = parent_and_export(variant, sub_transformer)
    assert refusal(exported, exported.cfg) is None
    assert_same_scores(exported, tmp_path)


def test_a_stock_transformer_scores_as_in_fairseq(tmp_path):
    """What prune_latent_layers writes: fairseq's pre-norm transformer (sinusoids, scaled tied embeddings)."""
    torch.manual_seed(0)
    model = build_model("transformer", ["--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "32",
                                        "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
                                        "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
                                        "--decoder-attention-heads", "4", "--share-all-embeddings",
                                        "--encoder-normalize-before", "--decoder-normalize-before"], vocab_size=VOCAB)
    assert refusal(model, model.cfg) is None
    assert_same_scores(model, tmp_path)


@pytest.mark.parametrize("arch, says", [
    ("multipath_transformer_tiny", "no layer for it"), ("widenet_tiny", "no layer for it"),
    ("partialformer_tiny", "no layer for it"), ("latent_depth_transformer_tiny", "prune_latent_layers"),
    ("scalable_transformer_tiny", "export_subnet"),
])
def test_models_ctranslate2_cannot_represent_are_refused_saying_why(arch, says):
    model = build_model(arch, vocab_size=VOCAB)
    assert says in refusal(model, model.cfg)


def test_a_type2_export_with_per_layer_widths_is_refused():
    _, exported = parent_and_export("pre-norm, projections", "type-2 D=64,128,128,64")
    assert "one head count" in refusal(exported, exported.cfg)


def test_a_stock_activation_ctranslate2_lacks_is_refused():
    model = build_model("transformer", ["--activation-fn", "tanh"], vocab_size=VOCAB)
    assert "tanh" in refusal(model, SimpleNamespace(**{**vars(model.cfg), "activation_fn": "tanh"}))
