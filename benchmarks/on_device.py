"""``--device`` and ``--dtype`` for the benchmarks: models and inputs on the device, and a clock that
waits for the device before it reads the time (CUDA kernels run asynchronously to the host)."""
import time

import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def add_arguments(parser):
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the models run")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                        help="parameters and activations: the whole model cast, as fairseq's --fp16 does")


def check(parser, args):
    """Exit through ``parser.error`` when ``--device cuda`` is asked for where there is no CUDA."""
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU here")


def to(obj, args):
    """A model, or a tensor, dict, list or tuple of them, on ``--device``; floating-point ones in
    ``--dtype`` (token ids stay integers; anything else is returned as it is)."""
    if isinstance(obj, dict):
        return {k: to(v, args) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to(v, args) for v in obj)
    if isinstance(obj, torch.nn.Module) or (isinstance(obj, torch.Tensor) and obj.is_floating_point()):
        return obj.to(device=args.device, dtype=DTYPES[args.dtype])
    return obj.to(args.device) if isinstance(obj, torch.Tensor) else obj


def training_loss(model, batch, pad: int = 1):
    """Cross-entropy of ``model`` on ``batch`` = (src, src_lengths, prev_output_tokens, target),
    padding (fairseq's index 1) ignored, plus the model's auxiliary balance losses in ``extra``."""
    src, lengths, prev, target = batch
    logits, extra = model(src, lengths, prev)
    loss = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), ignore_index=pad)
    return loss + sum(aux.float().sum() for aux in extra.get("moe_balance_loss", []))


def clock(args) -> float:
    """``time.perf_counter()`` once the device has finished the work queued so far."""
    if args.device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def describe(args) -> dict:
    """The device and dtype, for a benchmark's JSON line."""
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    return {"device": name, "dtype": args.dtype}
