"""Batches for measurements: the sentences of a fairseq task's split, or random tokens of a given
shape (the benchmarks', reproducible for a seed)."""
from typing import List, Tuple

import numpy as np
import torch
from torch import Tensor


def batches(task, subset: str, max_sentences: int, max_tokens: int = 4096) -> list:
    """The first ``max_sentences`` sentences of ``task``'s ``subset`` (0: all), collated into
    fairseq batches of at most ``max_tokens`` tokens."""
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    indices = np.arange(min(len(dataset), max_sentences or len(dataset)))
    batch_sampler = dataset.batch_by_size(indices, max_tokens=max_tokens)
    return [dataset.collater([dataset[int(i)] for i in batch]) for batch in batch_sampler]


def random_training_batches(n: int, bsz: int, src_len: int, tgt_len: int, vocab: int, seed: int = 0
                            ) -> List[Tuple[Tensor, Tensor, Tensor, Tensor]]:
    """``n`` batches ``(src_tokens (bsz, src_len), src_lengths (bsz,), prev_output_tokens (bsz,
    tgt_len), target (bsz, tgt_len))`` of tokens drawn uniformly from the non-special ids."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(4, vocab, (bsz, src_len), generator=g), torch.full((bsz,), src_len),
             torch.randint(4, vocab, (bsz, tgt_len), generator=g), torch.randint(4, vocab, (bsz, tgt_len), generator=g))
            for _ in range(n)]


def random_source_batches(n: int, bsz: int, src_len: int, vocab: int, seed: int = 0) -> List[dict]:
    """``n`` decoding batches ``{"net_input": {src_tokens (bsz, src_len), src_lengths (bsz,)}}``."""
    g = torch.Generator().manual_seed(seed)
    return [{"net_input": {"src_tokens": torch.randint(4, vocab, (bsz, src_len), generator=g),
                           "src_lengths": torch.full((bsz,), src_len)}} for _ in range(n)]
