#!/usr/bin/env python
"""Host synchronisations per training pass on a CUDA GPU, for every architecture's Multi30k preset
and the stock Transformer beside them: at each one the host waits until the GPU has drained its queue.

A training step here is the model's part of fairseq's step: forward, a loss (cross-entropy on
random targets plus the model's auxiliary losses in ``extra``), backward, and an Adam update; a
scalable model makes a pass (forward, backward) for each width of ``--widths`` (its staged
training visits every width), the others one. After ``--warmup`` steps,
``torch.cuda.set_sync_debug_mode("warn")`` turns every synchronising call into a warning; they
are counted over ``--steps`` steps, attributed to the Python line that made them, and divided by
the passes. Then the same at inference, per decoding step: the model in eval mode, the encoder
once and the decoder position by position with its incremental state, as fairseq-generate calls
them. WideNet is counted with its MoE layers' calls per pass and per decoding step.

``--dtype fp16|bf16`` casts the model, as ``--fp16``/``--bf16`` do for the forward and backward
passes; fairseq then steps fp32 master copies (its optimizer's syncs, not the model's), so a half
model is not stepped here. With ``--autocast`` the parameters stay fp32, are stepped, and the
forward passes run under autocast in that dtype, as fairseq's train_step runs them (its ``--amp``
is fp16 autocast). The last line is one JSON
object: per system, syncs per training pass and per decoding step, the ``file:line code`` sites
(the innermost Python line, possibly torch's own) with their syncs per pass or step, MoE calls per
pass and per step, the dtypes its parameters and its MoE layers' products had, and whether it was
stepped.

    python benchmarks/host_syncs.py [--batch-size 32] [--src-len 30] [--tgt-len 30] [--steps 3]
        [--dtype fp32|fp16|bf16] [--autocast]
    python benchmarks/host_syncs.py --systems widenet,transformer --dtype bf16 --autocast
"""
import argparse
import json
import linecache
import warnings
from collections import Counter

import torch

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq_widearch.experiments.settings import plugin_archs
from fairseq_widearch.model_builder import build_model
from fairseq_widearch.modules import MoELayer
from on_device import DTYPES, training_loss

PAD = 1  # fairseq's padding index
#: Flags beyond an architecture's Multi30k preset: latent depth with straight-through hard samples
#: from the first update, as LL-D trains after its soft phase.
FLAGS = {"latent_depth_transformer": ["--decoder-layers", "12", "--latent-soft-updates", "0"]}
SYSTEMS = {
    "transformer": ("transformer", ["--encoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512",
                                    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
                                    "--encoder-layers", "3", "--decoder-layers", "3"]),
    **{arch: (f"{arch}_multi30k", FLAGS.get(arch, [])) for arch in plugin_archs()},
}


def step(model, batch, widths, amp):
    """One training pass per width, the forward under ``amp()`` (autocast, or nothing), as
    fairseq's train_step runs it."""
    for width in widths or [None]:  # one pass per width
        if width:
            model.set_sample_config(width)
        with amp():
            loss = training_loss(model, batch, PAD)
        loss.backward()


def site(warning) -> str:
    """``file:line code`` of the Python line that synchronised (file from its package down)."""
    path = warning.filename.split("site-packages/")[-1].split("fairseq_widearch/")[-1]
    return f"{path}:{warning.lineno} {linecache.getline(warning.filename, warning.lineno).strip()}"


def product_dtype(x: torch.Tensor) -> str:
    """The dtype a matmul on ``x`` runs in: autocast's where it is on, else x's."""
    device = x.device.type
    return str(torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype)


def synchronisations(model, run, passes: int) -> dict:
    """``run()`` under ``torch.cuda.set_sync_debug_mode("warn")`` (on CUDA), per pass: ``syncs``,
    ``sites`` ({"file:line code": syncs}), the model's ``moe_calls`` and the ``dtypes`` of the MoE
    products."""
    cuda = next(model.parameters()).is_cuda
    calls, dtypes = Counter(), set()

    def seen(module, inputs):
        calls.update(["moe"])
        dtypes.add(product_dtype(inputs[0]))
    hooks = [m.register_forward_pre_hook(seen) for m in model.modules() if isinstance(m, MoELayer)]
    if cuda:
        torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
            for hook in hooks:
                hook.remove()
    # torch's warning at each sync (not the debug mode's one-time notice at its switch)
    where = Counter(site(w) for w in caught if "called a synchronizing CUDA operation" in str(w.message))
    return {"syncs": sum(where.values()) / passes, "sites": {k: v / passes for k, v in where.most_common()},
            "moe_calls": calls["moe"] / passes, "dtypes": sorted(dtypes)}


def decode(model, batch, steps: int, amp):
    """Inference as fairseq-generate runs it: the encoder once, the decoder position by position
    with its incremental state (``steps`` positions: one pass each), under ``amp()``."""
    src, lengths, prev, _ = batch
    with torch.no_grad(), amp():
        encoder_out, state = model.encoder(src, lengths), {}
        for t in range(1, steps + 1):
            model.decoder(prev[:, :t], encoder_out=encoder_out, incremental_state=state)


def count(arch, argv, args) -> dict:
    """One system's counts: ``training`` (per pass) and ``inference`` (per decoding step), each as
    ``synchronisations`` gives them, its ``parameters``' dtypes and whether it was ``stepped``."""
    torch.manual_seed(0)
    dtype = torch.float32 if args.autocast else DTYPES[args.dtype]
    model = build_model(arch, argv, vocab_size=args.vocab).to(args.device, dtype).train()
    # fairseq steps a half model's fp32 master copies (its own syncs); Adam on half weights would
    # make them NaN (eps 1e-8 is 0 in fp16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4) if dtype == torch.float32 else None
    widths = args.widths if hasattr(model, "set_sample_config") else []
    bsz = args.batch_size
    src, prev, target = (torch.randint(4, args.vocab, (bsz, n), device=args.device)
                         for n in (args.src_len, args.tgt_len, args.tgt_len))
    lengths = torch.full((bsz,), args.src_len, device=args.device)
    # padded as fairseq pads: one source 2 tokens shorter (left-padded), one target too (right)
    src[0, :2], lengths[0], prev[0, -2:], target[0, -2:] = PAD, args.src_len - 2, PAD, PAD
    batch = (src, lengths, prev, target)

    def amp():
        return torch.autocast(args.device, dtype=DTYPES[args.dtype], enabled=args.autocast)

    def update():
        step(model, batch, widths, amp)
        if optimizer:
            optimizer.step()
        model.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        update()
    training = synchronisations(model, lambda: [update() for _ in range(args.steps)],
                                args.steps * max(len(widths), 1))
    model.eval()
    decode(model, batch, 2, amp)  # warm-up
    inference = synchronisations(model, lambda: decode(model, batch, args.tgt_len, amp), args.tgt_len)
    return {"training": training, "inference": inference, "stepped": optimizer is not None,
            "parameters": sorted({str(p.dtype) for p in model.parameters()})}


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=30)
    p.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")], default=[64, 128, 192, 256])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32", help="the model's dtype (as --fp16, --bf16)")
    p.add_argument("--autocast", action="store_true",
                   help="fp32 parameters, the forward passes under autocast in --dtype (--amp: fp16)")
    # the tests' CPU run: every count but the syncs (sync debug mode is CUDA's)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("needs a CUDA GPU (sync debug mode is CUDA's)")
    counted = {}
    for name in args.systems.split(","):
        arch, flags = SYSTEMS[name]
        counted[name] = c = count(arch, flags, args)
        training, inference = c["training"], c["inference"]
        print(f"{name:26s} {training['syncs']:6.1f} syncs per training pass, {inference['syncs']:6.1f} per decoding "
              "step  " + "\n    ".join(f"x{v:g}  {k}" for k, v in {**training["sites"], **inference["sites"]}.items()))

    def per_system(phase: str, field: str) -> dict:
        return {name: c[phase][field] for name, c in counted.items()}
    print(json.dumps({"syncs_per_pass": per_system("training", "syncs"), "sites": per_system("training", "sites"),
                      "moe_calls_per_pass": per_system("training", "moe_calls"),
                      "syncs_per_decoding_step": per_system("inference", "syncs"),
                      "decoding_sites": per_system("inference", "sites"),
                      "moe_calls_per_decoding_step": per_system("inference", "moe_calls"),
                      "moe_product_dtypes": {name: sorted({*c["training"]["dtypes"], *c["inference"]["dtypes"]})
                                             for name, c in counted.items()},
                      "parameter_dtypes": {name: c["parameters"] for name, c in counted.items()},
                      "stepped": {name: c["stepped"] for name, c in counted.items()},
                      "dtype": args.dtype, "autocast": args.autocast,
                      "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device}))

if __name__ == "__main__":
    main()
