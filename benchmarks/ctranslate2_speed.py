#!/usr/bin/env python
"""Beam-search decoding throughput of one model in fairseq and in CTranslate2 (fp32 and int8).

The model is what ``prune_latent_layers`` or ``export_subnet`` hands to
``python -m fairseq_widearch.cli.export_ctranslate2``: a standard pre-norm Transformer, here of the
Multi30k body (d = 128, FFN 512, 4 heads, 3 + 3 layers, shared vocabulary of ``--vocab`` types),
randomly initialised (speed does not depend on the weights). fairseq decodes with the
``SequenceGenerator`` fairseq-generate uses; CTranslate2 with ``Translator.translate_batch``; both
the same random source batches, the same beam and batch size, exactly ``--tgt-len`` target tokens
per sentence (so both do the same number of steps), on the CPU with the same number of threads,
alternating rounds in one process. The last line is one JSON object with each engine's
sentences/s and the ratios to fairseq.

    python benchmarks/ctranslate2_speed.py [--batch-size 32] [--beam 5] [--rounds 3]
"""
import argparse
import json
import tempfile

import ctranslate2
import torch
from fairseq.sequence_generator import SequenceGenerator

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.cli.export_ctranslate2 import build_spec
from fairseq_widearch.experiments.counting import alternating_rounds
from fairseq_widearch.experiments.data import random_source_batches
from fairseq_widearch.model_builder import build_model

BODY = ["--encoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512", "--encoder-attention-heads", "4",
        "--encoder-layers", "3", "--decoder-embed-dim", "128", "--decoder-ffn-embed-dim", "512",
        "--decoder-attention-heads", "4", "--decoder-layers", "3", "--share-all-embeddings",
        "--encoder-normalize-before", "--decoder-normalize-before"]


def translators(model, out_dir: str, threads: int) -> dict:
    """CTranslate2 translators of ``model`` in fp32 and int8 weights."""
    dictionary = model.decoder.dictionary

    class Converter(ctranslate2.converters.Converter):
        def _load(self):  # a fresh spec each time: converting one changes it
            return build_spec(model, model.cfg, dictionary, dictionary)

    result = {}
    for quantization in ("float32", "int8"):
        path = Converter().convert(f"{out_dir}/{quantization}", quantization=quantization, force=True)
        result[f"ctranslate2_{'fp32' if quantization == 'float32' else 'int8'}"] = ctranslate2.Translator(
            path, device="cpu", intra_threads=threads)
    return result


def decoders(model, batches, args) -> dict:
    """name -> a function decoding every batch once, each engine the same work."""
    gen = SequenceGenerator([model], model.decoder.dictionary, beam_size=args.beam, max_len_a=0,
                            max_len_b=args.tgt_len, min_len=args.tgt_len)
    symbols = model.encoder.dictionary.symbols
    sources = [[[symbols[t] for t in row] for row in b["net_input"]["src_tokens"].tolist()] for b in batches]
    eos = model.encoder.dictionary.eos()  # fairseq's sources end in </s>; CTranslate2 appends it itself
    batches = [{"net_input": {"src_tokens": torch.cat([b["net_input"]["src_tokens"],
                                                       torch.full((len(b["net_input"]["src_tokens"]), 1), eos)], 1),
                              "src_lengths": b["net_input"]["src_lengths"] + 1}} for b in batches]

    def fairseq():
        with torch.no_grad():
            for batch in batches:
                gen.generate([model], batch)

    def ctranslate(translator):
        def run():
            for tokens in sources:
                translator.translate_batch(tokens, beam_size=args.beam, max_batch_size=args.batch_size,
                                           min_decoding_length=args.tgt_len, max_decoding_length=args.tgt_len)
        return run

    tmp = tempfile.mkdtemp()
    return {"fairseq": fairseq, **{name: ctranslate(t) for name, t in
                                   translators(model, tmp, torch.get_num_threads()).items()}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=10000, help="shared vocabulary")
    p.add_argument("--batch-size", type=int, default=32, help="source sentences per batch")
    p.add_argument("--batches", type=int, default=2, help="batches per engine per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--tgt-len", type=int, default=20)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = build_model("transformer", BODY, vocab_size=args.vocab).eval()
    batches = random_source_batches(args.batches, args.batch_size, args.src_len, args.vocab)
    engines = decoders(model, batches, args)
    for run in engines.values():  # warm-up
        run()
    seconds = alternating_rounds(engines, args.rounds)
    sentences = args.rounds * args.batches * args.batch_size
    result = {name: {"sentences_per_s": round(sentences / s, 2)} for name, s in seconds.items()}
    for name, res in result.items():
        res["ratio"] = round(res["sentences_per_s"] / result["fairseq"]["sentences_per_s"], 3)
        print(f"{name:>18}: {res['sentences_per_s']:8.2f} sentences/s  ({res['ratio']}x fairseq)")
    print(json.dumps({"device": "cpu", "threads": torch.get_num_threads(), "beam": args.beam,
                      "batch_size": args.batch_size, "src_len": args.src_len, "tgt_len": args.tgt_len,
                      "vocab": args.vocab, **result}))


if __name__ == "__main__":
    main()
