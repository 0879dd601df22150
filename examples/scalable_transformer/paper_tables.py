"""Parameters and FLOPs of every sub-Transformer width next to Gao et al. (2021), Tables 1 and 7.

    python examples/scalable_transformer/paper_tables.py [--vocab-size 32768]

Prints a markdown table (ours vs paper, relative difference) of the type-1 sub-Transformers of
``scalable_transformer_wmt_en_de`` with and without I/O projections, and the largest difference.
FLOPs are :func:`fairseq_widearch.experiments.counting.count_table1_flops` (our reconstruction of the
paper's convention); parameters are the cropped tensors the sub-Transformer uses.
"""
import argparse

from fairseq_widearch.experiments.counting import count_table1_flops
from fairseq_widearch.model_builder import build_model

WIDTHS = list(range(256, 1025, 64))
TABLE7_PARAMS = [46, 52, 60, 69, 79, 91, 104, 119, 135, 152, 171, 191, 209]
TABLE1_PARAMS = [45, 51, 59, 68, 79, 91, 104, 119, 135, 152, 171, 191, 209]
TABLE1_PARAMS_NO_IO = [19, 28, 37, 48, 61, 75, 90, 106, 124, 144, 163, 186, 209]
TABLE1_FLOPS = [5.2, 6.6, 8.1, 9.7, 11.3, 12.9, 14.6, 16.4, 18.2, 20.1, 22.0, 23.98, 26.02]


def rows(vocab_size: int):
    """Per width: ours (params M, params M without I/O projections, GFLOPs) and the paper's."""
    with_io = build_model("scalable_transformer_wmt_en_de", vocab_size=vocab_size)
    no_io = build_model("scalable_transformer_wmt_en_de", ["--no-io-projections"], vocab_size=vocab_size)
    for i, width in enumerate(WIDTHS):
        with_io.set_sample_config(width)
        no_io.set_sample_config(width)
        yield (width, with_io.sub_transformer_num_params() / 1e6, no_io.sub_transformer_num_params() / 1e6,
               count_table1_flops(with_io) / 1e9, TABLE7_PARAMS[i], TABLE1_PARAMS[i], TABLE1_PARAMS_NO_IO[i],
               TABLE1_FLOPS[i])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab-size", type=int, default=32768, help="shared vocabulary (dictionary) size")
    args = p.parse_args(argv)
    print("| width | params M (Table 7 / Table 1) | ours | params M no I/O (Table 1) | ours | GFLOPs (Table 1) | ours |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for width, params, params_no_io, flops, t7, t1, t1_no_io, t1_flops in rows(args.vocab_size):
        diffs = [params / t7 - 1, params_no_io / t1_no_io - 1, flops / t1_flops - 1]
        worst = max(worst, *map(abs, diffs))
        print(f"| {width} | {t7} / {t1} | {params:.2f} ({diffs[0]:+.1%}) | {t1_no_io} | {params_no_io:.2f} "
              f"({diffs[1]:+.1%}) | {t1_flops} | {flops:.2f} ({diffs[2]:+.1%}) |")
    print(f"largest difference to Table 7 params, Table 1 params without I/O projections and FLOPs: {worst:.1%}")


if __name__ == "__main__":
    main()
