"""export_subnet is exact for every variant (Gao et al. 2021, Sec. 3.2): post-norm or pre-norm,
with input/output projections (Eqs. 3-5) or I/O cropping, type-1 and type-2 sub-Transformers.
The exported model is loaded as fairseq loads a checkpoint (its ``upgrade_state_dict`` first)."""
import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_widearch.model_builder import dummy_dictionary
from testing_utils import SUB_TRANSFORMERS, VARIANTS, VOCAB, parent_and_export


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
