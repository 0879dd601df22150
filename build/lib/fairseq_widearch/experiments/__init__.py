"""What the recipes, the comparison (``examples/compare``), the claims study (``examples/claims``),
the benchmarks, the tools and the tests share; training and decoding with the plugin need none of it.

- ``.settings``: the Multi30k body, the optimisation flags, the criterion of an arch;
- ``.scoring``: decoding with ``fairseq-generate`` and sacreBLEU scoring, teacher-forced NLL;
- ``.counting``: parameter, MAC and FLOP counts, the matmul peak;
- ``.data``: batches of a fairseq task's split, or of random tokens;
- ``.runner``: training runs that resume, recorded one JSON row per run.
"""
