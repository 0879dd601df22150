#!/usr/bin/env python
"""Scalable Transformers: (a) an exported sub-Transformer decodes as fast as a natively built model
of identical dimensions; (b) one training update of the widest + 2 sampled sub-Transformers costs
no more than the three models' separate updates.

(a) ``scalable_transformer`` (M_max 1024, 6 + 6 layers, I/O projections) is exported at width 512
with ``export_subnet``'s code and beam-searched (beam 4, exactly ``--tgt-len`` steps) next to the
same architecture built natively at width 512 (``--exported-width 512``, random weights) and next
to the parent cropping its tensors on the fly at width 512. The I/O-cropping variant's width-512
export, whose dimensions are exactly those of fairseq's ``transformer`` (d 512, FFN 2048, 8
heads), is also raced against it. Models alternate rounds in one process.
(b) ``scalable_translation.train_step`` (stage 1: widest + narrowest + one random width, one
backward each) plus one Adam step, against forward + backward + Adam step of the three models
built natively at those widths, one after another; alternating rounds, medians.

The last output line is one JSON object with ``export_speed_ratio`` (exported / native decoding
throughput, target >= 0.95) and ``train_step_ratio`` (scalable update / sum of the three separate
updates, target <= 1.1), plus the other ratios.

On a GPU: ``--device cuda --dtype fp16 --batch-size 128 --train-tokens 8000``.

    python benchmarks/scalable_speed.py [--rounds 6] [--train-width 512] [--train-rounds 3] [--device cpu|cuda]
        [--dtype fp32|fp16|bf16]
"""
import argparse
import json
import statistics
from functools import partial

import torch

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.cli.export_subnet import build, export_model
from fairseq_widearch.criterions.scalable_self_distillation import ScalableSelfDistillationCriterion
from fairseq_widearch.experiments.counting import alternating_rounds
from fairseq_widearch.experiments.data import random_source_batches
from fairseq_widearch.model_builder import build_model, dummy_dictionary, parse_arch_args
from fairseq_widearch.tasks.scalable_translation import ScalableTranslationConfig, ScalableTranslationTask
from on_device import add_arguments, check, clock, describe, to
from partialformer_speed import decode, generator

FAIRSEQ_512 = ["--encoder-embed-dim", "512", "--encoder-ffn-embed-dim", "2048", "--encoder-attention-heads", "8",
               "--decoder-attention-heads", "8", "--share-all-embeddings"]


def exported(arch_argv, width, vocab):
    """(exported sub-Transformer of a random parent, the same dimensions natively built)."""
    args = parse_arch_args("scalable_transformer", arch_argv)
    parent = build(args, vocab, vocab)
    parent.set_sample_config(width)
    sub, sub_args = export_model(parent, args)
    return parent, sub, build(sub_args, vocab, vocab)


def race(models: dict, batches, args) -> dict:
    """Sentences per second of each model's beam search, alternating rounds."""
    gens = {name: generator(to(model, args).eval(), args) for name, model in models.items()}
    for gen in gens.values():  # warm-up: first-call allocations are not timed
        decode(gen, batches[:1])
    seconds = alternating_rounds({name: partial(decode, gen, batches) for name, gen in gens.items()},
                                 args.rounds, lambda: clock(args))
    return {name: args.rounds * len(batches) * args.batch_size / s for name, s in seconds.items()}


class Backward:
    """fairseq's optimizer interface as the task uses it."""

    @staticmethod
    def backward(loss):
        loss.backward()


def train_batch(vocab, tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    bsz, length = tokens // 25, 25
    target = torch.randint(4, vocab, (bsz, length), generator=g)
    prev = torch.cat([torch.full((bsz, 1), 2), target[:, :-1]], 1)
    src = torch.randint(4, vocab, (bsz, length), generator=g)
    return {"net_input": {"src_tokens": src, "src_lengths": torch.full((bsz,), length), "prev_output_tokens": prev},
            "target": target, "ntokens": target.numel()}


def timed(step, args) -> float:
    start = clock(args)
    step()
    return clock(args) - start


def train_ratio(args) -> dict:
    argv = ["--encoder-embed-dim", str(args.train_width), "--scalable-widths",
            ",".join(map(str, range(64 * max(1, args.train_width // 256), args.train_width + 1, 64)))]
    d = dummy_dictionary(args.vocab)
    task = ScalableTranslationTask(ScalableTranslationConfig(seed=1, num_sub_transformers=2), d, d)
    criterion = ScalableSelfDistillationCriterion(task, False, 0.1, distill_stage=1)
    scalable = to(build_model("scalable_transformer", argv, src_dict=d), args)
    update_num = 0
    widths = [c for c, _ in task.sub_transformers(scalable, update_num)]
    separate = {w: to(build_model("scalable_transformer", [*argv, "--exported-width", str(w)], src_dict=d), args)
                for w in widths}
    optimizers = {m: torch.optim.Adam(m.parameters(), lr=1e-4) for m in [scalable, *separate.values()]}
    sample = to(train_batch(args.vocab, args.train_tokens), args)

    def scalable_update():
        optimizers[scalable].zero_grad()
        task.train_step(sample, scalable, criterion, Backward, update_num)
        optimizers[scalable].step()

    def separate_updates():
        for model in separate.values():
            optimizers[model].zero_grad()
            model.train()
            loss = criterion(model, sample)[0]
            loss.backward()
            optimizers[model].step()

    times = {"scalable": [], "separate": []}
    for r in range(args.train_rounds + 1):  # round 0 warms up
        for name, step in (("scalable", scalable_update), ("separate", separate_updates))[:: 1 if r % 2 else -1]:
            seconds = timed(step, args)
            if r:
                times[name].append(seconds)
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {"train_widths": widths, "scalable_update_s": round(medians["scalable"], 3),
            "separate_updates_s": round(medians["separate"], 3),
            "train_step_ratio": round(medians["scalable"] / medians["separate"], 3)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--width", type=int, default=512, help="(a) the exported width")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--tgt-len", type=int, default=20)
    p.add_argument("--train-width", type=int, default=512, help="(b) M_max of the trained model")
    p.add_argument("--train-tokens", type=int, default=2000, help="(b) target tokens per batch")
    p.add_argument("--train-rounds", type=int, default=3)
    add_arguments(p)
    args = p.parse_args(argv)
    check(p, args)
    torch.manual_seed(0)
    batches = to(random_source_batches(args.batches, args.batch_size, args.src_len, args.vocab), args)
    parent, sub, native = exported([], args.width, args.vocab)
    speeds = race({"exported": sub, "native": native, "parent_cropped": parent}, batches, args)
    del parent, sub, native
    _, sub_io, _ = exported(["--no-io-projections"], args.width, args.vocab)
    fairseq = build_model("transformer", FAIRSEQ_512, vocab_size=args.vocab)
    io_speeds = race({"exported_io_cropping": sub_io, "fairseq_transformer": fairseq}, batches, args)
    for name, speed in {**speeds, **io_speeds}.items():
        print(f"{name:>22}: {speed:7.2f} sentences/s (beam {args.beam}, width {args.width})")
    train = train_ratio(args)
    print(f"train update, widths {train['train_widths']}: scalable {train['scalable_update_s']} s, "
          f"separate {train['separate_updates_s']} s")
    print(json.dumps({"threads": torch.get_num_threads(), **describe(args),
                      "export_speed_ratio": round(speeds["exported"] / speeds["native"], 3),
                      "parent_cropped_over_exported": round(speeds["parent_cropped"] / speeds["exported"], 3),
                      "io_cropping_export_over_fairseq_transformer":
                          round(io_speeds["exported_io_cropping"] / io_speeds["fairseq_transformer"], 3),
                      **train}))


if __name__ == "__main__":
    main()
