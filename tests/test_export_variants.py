"""export_subnet is exact for every variant (Gao et al. 2021, Sec. 3.2): post-norm or pre-norm,
with input/output projections (Eqs. 3-5) or I/O cropping, type-1 and type-2 sub-Transformers.
The exported model is loaded as fairseq loads a checkpoint (its ``upgrade_state_dict`` first)."""
import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_widearch.cli.export_subnet import build, export_model
from fairseq_widearch.model_builder import dummy_dictionary, parse_arch_args

VOCAB = 40
PRE_NORM = ["--encoder-normalize-before", "--decoder-normalize-before"]
VARIANTS = {"post-norm, projections": [], "pre-norm, projections": PRE_NORM,
            "post-norm, I/O cropping": ["--no-io-projections"],
            "pre-norm, I/O cropping": ["--no-io-projections", *PRE_NORM]}
SUB_TRANSFORMERS = {"type-1 C=64": (64, None), "type-2 D=64,128,128,64": (128, [64, 128, 128, 64]),
                    "type-2 D=64 at C=128": (128, [64, 64, 64, 64])}


def parent_and_export(variant, sub_transformer):
    torch.manual_seed(0)
    args = parse_arch_args("scalable_transformer_tiny", VARIANTS[variant])
    parent = build(args, VOCAB, VOCAB)
    parent.set_sample_config(*SUB_TRANSFORMERS[sub_transformer])
    exported, exported_args = export_model(parent, args)
    loaded = build(exported_args, VOCAB, VOCAB)
    loaded.load_state_dict(exported.state_dict())  # fairseq's load: upgrade_state_dict, then the weights
    return parent, loaded


def sentences(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (3, 9), generator=g)
    src[0, :3] = 1  # left padding
    prev = torch.cat([torch.full((3, 1), 2), torch.randint(4, VOCAB, (3, 6), generator=g)], dim=1)
    return src, torch.tensor([6, 9, 9]), prev


@pytest.mark.parametrize("sub_transformer", SUB_TRANSFORMERS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_exported_logits_equal_the_parents(variant, sub_transformer):
    parent, loaded = parent_and_export(variant, sub_transformer)
    src, lengths, prev = sentences()
    with torch.no_grad():
        assert (parent.eval()(src, lengths, prev)[0] - loaded.eval()(src, lengths, prev)[0]).abs().max() <= 1e-5


@pytest.mark.parametrize("sub_transformer", SUB_TRANSFORMERS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_exported_beam_search_gives_the_parents_hypotheses(variant, sub_transformer):
    parent, loaded = parent_and_export(variant, sub_transformer)
    src, lengths, _ = sentences(1)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    hypotheses = []
    for model in (parent.eval(), loaded.eval()):
        generator = SequenceGenerator([model], dummy_dictionary(VOCAB), beam_size=4, max_len_b=12)
        with torch.no_grad():
            hypotheses.append([[h["tokens"].tolist() for h in beams] for beams in generator.generate([model], sample)])
    assert hypotheses[0] == hypotheses[1]
