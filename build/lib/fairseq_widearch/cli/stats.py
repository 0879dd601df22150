"""Parameter and MAC counts of any registered fairseq architecture.

    python -m fairseq_widearch.cli.stats --arch ARCH [--vocab-size N] [any flag of ARCH]
                                         [--eval-width W [--layer-widths w1,...]]   (scalable_transformer)

Prints one JSON object: ``params`` (trainable parameters, shared tensors counted once),
``params_embedding`` (vocabulary-sized tables: token embeddings and an untied output projection),
``params_encoder`` / ``params_decoder`` (everything else in the encoder / decoder), and ``macs``,
the multiply-accumulates of one teacher-forced forward pass over one sentence pair of
``--src-len`` source and ``--tgt-len`` target tokens (20 and 20: the papers' convention),
output projection included (with ``--eval-width``: the cropped sub-Transformer of a
``scalable_transformer``, type-2 with ``--layer-widths``); and ``macs_decode``, the convention of Mehta et al. (2021) that
PartialFormer's Table 5 uses: the source encoded once, then ``--tgt-len`` greedy decoding steps,
each re-running the decoder on the whole prefix without a cache and projecting every position to
the vocabulary (it reproduces Table 5's 9.9B for a 6-6/512 Transformer and 6.3B for 24-6/360 at
vocabulary 34,040 within 1%). MACs are *measured*, not derived: ``torch.utils.flop_counter``
counts the FLOPs of every matmul the model runs (attention through the math SDPA kernel so its
two matmuls are seen), and MACs = FLOPs / 2. Element-wise work (softmax, norms) is not counted.
"""
import argparse
import json
import sys

import fairseq_widearch  # noqa: F401  (registers the plugin's architectures)
from fairseq_widearch.cli import whole, widths
from fairseq_widearch.experiments.counting import model_stats


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Any other flag is passed to the architecture (e.g. --encoder-layers 24 --encoder-normalize-before).",
    )
    parser.add_argument("--arch", required=True, help="any registered fairseq architecture or preset")
    parser.add_argument("--vocab-size", type=whole(5, "the 4 special symbols and a word"), default=32000,
                        help="size of the joined (source = target) dictionary, specials included")
    parser.add_argument("--src-len", type=whole(1), default=20, help="source tokens for the MAC count")
    parser.add_argument("--tgt-len", type=whole(1), default=20, help="target tokens for the MAC count")
    parser.add_argument("--eval-width", type=whole(0, "0: the whole model"), default=0,
                        help="scalable_transformer: count the sub-Transformer of width C (type-1 alone)")
    parser.add_argument("--layer-widths", default=None, type=widths,
                        help="scalable_transformer, type-2: D^i of every encoder then decoder layer, comma-separated")
    return parser


def main(argv=None):
    args, arch_argv = parser().parse_known_args(argv)
    layer_widths = args.layer_widths
    try:
        stats = model_stats(args.arch, arch_argv, args.vocab_size, args.src_len, args.tgt_len, args.eval_width,
                            layer_widths)
    except ValueError as e:
        sys.exit(f"error: {e}")
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
