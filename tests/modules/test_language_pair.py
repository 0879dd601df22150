"""LanguagePairIndex: a sentence's language pair from its encoder language token."""
import pytest
import torch

from fairseq_widearch.model_builder import dummy_dictionary
from fairseq_widearch.modules import LanguagePairIndex


def dictionary():
    d = dummy_dictionary(20)
    for tok in ("__de__", "__fr__", "__cs__"):
        d.add_symbol(tok)
    return d


def test_mixed_batch_left_and_right_padded():
    d = dictionary()
    index = LanguagePairIndex(d, ["__de__", "__fr__", "__cs__"])
    de, fr, cs, pad = d.index("__de__"), d.index("__fr__"), d.index("__cs__"), d.pad()
    left = torch.tensor([[pad, pad, fr, 5, 2], [de, 6, 7, 8, 2], [pad, cs, 9, 9, 2]])
    assert index(left).tolist() == [1, 0, 2]
    right = torch.tensor([[cs, 5, 2, pad], [fr, 6, 7, 2]])
    assert index(right).tolist() == [2, 1]


def test_errors():
    d = dictionary()
    with pytest.raises(ValueError, match="distinct encoder language tokens"):
        LanguagePairIndex(d, ["__de__", "__de__"])
    with pytest.raises(ValueError, match=r"\['__ro__'\] are not in the source dictionary"):
        LanguagePairIndex(d, ["__de__", "__ro__"])
    with pytest.raises(ValueError, match="starts with none of the language tokens"):
        LanguagePairIndex(d, ["__de__", "__fr__"])(torch.tensor([[5, 6, 2]]))
