"""The language pair of each sentence of a multilingual batch, read from its encoder language token."""
from typing import List

import torch
import torch.nn as nn
from torch import Tensor


class LanguagePairIndex(nn.Module):
    """Maps source sentences to the index of their language pair by the language token that
    fairseq's multilingual tasks put in front of the source (``translation_multi_simple_epoch``
    with ``--encoder-langtok tgt``: ``__de__`` in one-to-many; ``src`` in many-to-one). A batch may
    mix pairs; left or right padding both work.

    Args:
        dictionary: the source dictionary (holding the language tokens).
        langtoks (list of str): the language token of each pair, in pair order.

    Shapes:
        ``forward(src_tokens (B, src_len))`` -> pair indices ``(B,)`` (long).

    Raises:
        ValueError: at construction if a token is not in the dictionary or two pairs share one;
            in ``forward`` if a sentence does not start with any of the tokens.
    """

    def __init__(self, dictionary, langtoks: List[str]):
        super().__init__()
        if len(set(langtoks)) != len(langtoks):
            raise ValueError(f"language pairs must have distinct encoder language tokens, got {langtoks}")
        missing = [tok for tok in langtoks if dictionary.index(tok) == dictionary.unk()]
        if missing:
            raise ValueError(f"language tokens {missing} are not in the source dictionary")
        table = torch.full((len(dictionary),), -1, dtype=torch.long)
        table[[dictionary.index(tok) for tok in langtoks]] = torch.arange(len(langtoks))
        self.register_buffer("table", table, persistent=False)  # derived from the dictionary
        self.langtoks, self.padding_idx = langtoks, dictionary.pad()

    def forward(self, src_tokens: Tensor) -> Tensor:
        first = src_tokens.ne(self.padding_idx).int().argmax(dim=1, keepdim=True)  # first non-pad token
        pair = self.table[src_tokens.gather(1, first).squeeze(1)]
        if bool((pair < 0).any()):
            raise ValueError(f"a source sentence starts with none of the language tokens {self.langtoks}")
        return pair
