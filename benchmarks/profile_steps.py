#!/usr/bin/env python
"""Where the time of a missed speed target goes (docs/gpu.md, "Current figures"): each case's step
run under ``torch.profiler``, its GPU time (or CPU time) split by operator and by our modules.

Cases (``--cases``, comma-separated):

* ``moe``: forward + backward of the MoE layer (``moe_throughput.py``'s, E 4, top-2, C 1.2), beside
  the dense FFN it is compared with;
* ``train``: a training step (forward, cross-entropy, backward; ``training_utilisation.py``'s) of
  each of ``--systems`` and of its stock twin at equal training FLOPs;
* ``decode``: one beam-4 batch of ``partialformer_speed.py``'s PartialFormer 24-6 and its
  Transformer twin.

Per profiled model, after one untimed warm-up: ``--steps`` steps recorded with the CPU and, on a GPU,
the CUDA activity. Printed: GPU (or CPU) time per step, kernels (operators on the CPU) per step,
the ``--top`` operators by self GPU (or CPU) time, and the forward time inside each module of depth
``--depth`` (scopes from forward hooks; backward time is not attributed to modules). The last
line is one JSON object with all of it.

    python benchmarks/profile_steps.py --device cuda --dtype fp16          # the missed targets at paper size
    python benchmarks/profile_steps.py --cases moe,train --systems multipath_transformer_tiny --vocab 1000 \\
        --batch-size 8 --tokens 256 --dim 64 --ffn 256                       # a CPU look at small sizes
"""
import argparse
import json
from collections import defaultdict

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.experiments.data import random_source_batches, random_training_batches
from fairseq_widearch.model_builder import build_model
from fairseq_widearch.modules import Experts, MoELayer, TopKRouter
from on_device import add_arguments, check, describe, to, training_loss
from partialformer_speed import generator
from partialformer_speed import models as decoding_models
from training_utilisation import step_flops, stock_flags, twin_layers

MISSED = "latent_depth_transformer_lld_12_24,scalable_transformer_wmt_en_de,partialformer_24_6_d360_h30_16"
SCOPE = "module:"


def module_scopes(model: torch.nn.Module, depth: int):
    """Forward hooks that open a ``record_function`` scope ``module:<name> (<class>)`` around every
    submodule of ``model`` at most ``depth`` levels down; -> the hook handles."""
    handles = []
    for name, module in model.named_modules():
        if name and name.count(".") < depth:
            scope = f"{SCOPE}{name} ({type(module).__name__})"
            opened = []
            handles.append(module.register_forward_pre_hook(
                lambda m, a, scope=scope, opened=opened: opened.append(record_function(scope).__enter__())))
            handles.append(module.register_forward_hook(
                lambda m, a, out, opened=opened: opened.pop().__exit__(None, None, None)))
    return handles


def profiled(step, model, args) -> dict:
    """Profile ``args.steps`` calls of ``step()`` (one warm-up first): -> per-step figures."""
    step()
    handles = module_scopes(model, args.depth)
    cuda = args.device == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    for handle in handles:
        handle.remove()
    events = prof.key_averages()
    self_time = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    total_time = (lambda e: e.device_time_total) if cuda else (lambda e: e.cpu_time_total)
    ops = [e for e in events if not e.key.startswith(SCOPE) and self_time(e) > 0]
    kernels = sum(e.count for e in events if cuda and e.device_type == torch.autograd.DeviceType.CUDA) if cuda \
        else sum(e.count for e in ops)
    modules = defaultdict(float)
    for e in events:
        if e.key.startswith(SCOPE):
            modules[e.key[len(SCOPE):]] += total_time(e) / 1e3 / args.steps
    ops.sort(key=self_time, reverse=True)
    return {"ms_per_step": round(sum(self_time(e) for e in ops) / 1e3 / args.steps, 3),
            "kernels_per_step": round(kernels / args.steps, 1),
            "top_ops": [[e.key, round(self_time(e) / 1e3 / args.steps, 3), round(e.count / args.steps, 1)]
                        for e in ops[:args.top]],
            "modules_forward_ms": {k: round(v, 3) for k, v in sorted(modules.items(), key=lambda kv: -kv[1])}}


def moe_case(args) -> dict:
    router = TopKRouter(args.dim, 4, 2, 1.2)
    moe = to(MoELayer(router, Experts(4, args.dim, args.ffn)), args).train()
    dense = to(torch.nn.Sequential(torch.nn.Linear(args.dim, args.ffn), torch.nn.ReLU(),
                                   torch.nn.Linear(args.ffn, args.dim)), args)
    x = to(torch.randn(args.tokens, 1, args.dim), args).requires_grad_()

    def moe_step():
        y, routing = moe(x)
        (y.float().sum() + routing.balance_loss).backward()

    def dense_step():
        dense(x).float().sum().backward()

    return {"moe": profiled(moe_step, moe, args), "dense_ffn": profiled(dense_step, dense, args)}


def train_case(args) -> dict:
    batch = to(random_training_batches(1, args.batch_size, args.src_len, args.tgt_len, args.vocab), args)[0]
    result = {}
    for system in args.systems.split(","):
        model = to(build_model(system, vocab_size=args.vocab), args).train()
        layers = twin_layers(system, step_flops(model, batch), batch, args)
        twin = to(build_model("transformer", stock_flags(system, layers), vocab_size=args.vocab), args).train()
        result[system] = {name: profiled(lambda m=m: training_loss(m, batch).backward(), m, args)
                          for name, m in ((system, model), (f"transformer ({layers}-layer encoder)", twin))}
    return result


def decode_case(args) -> dict:
    batch = to(random_source_batches(1, args.decode_batch_size, args.src_len, 34040), args)[0]
    result = {}
    for name, model in decoding_models(34040).items():
        gen = generator(to(model, args), argparse.Namespace(beam=4, tgt_len=args.tgt_len))
        result[name] = profiled(lambda g=gen: torch.no_grad()(g.generate)(g.model.models, batch), model, args)
    return result


CASES = {"moe": moe_case, "train": train_case, "decode": decode_case}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--systems", default=MISSED, help="arch presets for the train case")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch-size", type=int, default=128, help="sentences per training batch")
    p.add_argument("--decode-batch-size", type=int, default=128)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=30)
    p.add_argument("--tokens", type=int, default=8192, help="the MoE case's tokens per call")
    p.add_argument("--dim", type=int, default=768, help="the MoE case's model width")
    p.add_argument("--ffn", type=int, default=3072, help="the MoE case's expert FFN width")
    p.add_argument("--steps", type=int, default=3, help="profiled steps per model")
    p.add_argument("--top", type=int, default=12, help="operators listed per model")
    p.add_argument("--depth", type=int, default=3, help="module depth of the forward scopes")
    add_arguments(p)
    args = p.parse_args(argv)
    check(p, args)
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        p.error(f"unknown cases {sorted(unknown)}; choose from {', '.join(CASES)}")
    torch.manual_seed(0)
    results = {}
    for case in args.cases.split(","):
        results[case] = CASES[case](args)
        models = results[case].items() if case != "train" else \
            [(f"{s} / {n}", r) for s, pair in results[case].items() for n, r in pair.items()]
        for name, res in models:
            print(f"== {case}: {name}: {res['ms_per_step']} ms/step, {res['kernels_per_step']} kernels/step")
            for op, ms, count in res["top_ops"]:
                print(f"   {ms:9.3f} ms  x{count:<7} {op}")
            for scope, ms in list(res["modules_forward_ms"].items())[:args.top]:
                print(f"   forward {ms:9.3f} ms  {scope}")
    print(json.dumps({**describe(args), "steps": args.steps, **results}))


if __name__ == "__main__":
    main()
