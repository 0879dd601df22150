"""Parameter, MAC and FLOP counts of a model (measured with ``torch.utils.flop_counter``), the
device's matmul peak and the side-by-side timing of several systems: what the stats tool
(``fairseq_widearch.cli.stats``, whose help gives the conventions), the comparison, the claims
study, the benchmarks and the tests count and time with."""
import re
import time
import traceback

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ..model_builder import build_model


def _unique_params(module, seen):
    total = 0
    for p in module.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def param_counts(model) -> dict:
    """Split trainable parameters of an encoder-decoder model into embedding/encoder/decoder."""
    seen = set()
    embedding_tables = [model.encoder.embed_tokens, model.decoder.embed_tokens,
                        getattr(model.decoder, "output_projection", None)]
    embedding = sum(_unique_params(m, seen) for m in embedding_tables if m is not None)
    encoder, decoder = _unique_params(model.encoder, seen), _unique_params(model.decoder, seen)
    return {"params": embedding + encoder + decoder, "params_embedding": embedding,
            "params_encoder": encoder, "params_decoder": decoder}


def preset_param_counts(arch: str, argv=(), vocab_size: int = 32000) -> dict:
    """``param_counts`` of ``arch`` (flags ``argv``) built on the meta device: sizes only, no
    weights allocated or initialised, so that a paper-size preset counts in about a second.

    Raises:
        ValueError: on a bad flag value.
    """
    with torch.device("meta"):
        return param_counts(build_model(arch, argv, vocab_size=vocab_size))


def _measured_macs(run) -> int:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        run()
    return counter.get_total_flops() // 2


def _sentence_pair(model, src_len: int, tgt_len: int):
    vocab, nspecial = len(model.decoder.dictionary), model.decoder.dictionary.nspecial
    return torch.randint(nspecial, vocab, (1, src_len)), torch.randint(nspecial, vocab, (1, tgt_len))


def matmul_peak_flops(device: str = "cpu", dtype: torch.dtype = torch.float32, n: int = 2048,
                      repeats: int = 10) -> float:
    """The device's matmul peak in FLOP/s for ``dtype``: the best of ``repeats`` timed ``n × n``
    products of random matrices (after 3 untimed ones), the clock read once the device is done."""
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))

    def seconds():
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for _ in range(3):
        seconds()
    return 2 * n ** 3 / min(seconds() for _ in range(repeats))


def alternating_rounds(runs: dict, rounds: int, now=time.perf_counter) -> dict:
    """Seconds each of ``runs`` (name -> callable) took over ``rounds`` rounds, every run once a
    round and another one first each round, so that the machine's speed at any moment weighs on all
    of them alike. ``now``: the clock (on CUDA one that synchronises first)."""
    seconds, names = dict.fromkeys(runs, 0.0), list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = now()
            runs[name]()
            seconds[name] += now() - start
    return seconds


def count_macs(model, src_len: int = 20, tgt_len: int = 20) -> int:
    """Multiply-accumulates of one eval-mode forward over a ``(1, src_len)`` source and a
    ``(1, tgt_len)`` target prefix, measured with ``torch.utils.flop_counter``."""
    src, prev = _sentence_pair(model.eval(), src_len, tgt_len)
    return _measured_macs(lambda: model(src, torch.tensor([src_len]), prev))


def count_decode_macs(model, src_len: int = 20, tgt_len: int = 20) -> int:
    """Multiply-accumulates of encoding ``src_len`` tokens and ``tgt_len`` cache-free decoding
    steps (step t runs the decoder on the t-token prefix), the Mehta et al. (2021) convention."""
    src, prev = _sentence_pair(model.eval(), src_len, tgt_len)

    def decode():
        encoder_out = model.encoder(src, src_lengths=torch.tensor([src_len]))
        for t in range(1, tgt_len + 1):
            model.decoder(prev[:, :t], encoder_out=encoder_out)

    return _measured_macs(decode)


#: Attention positions of the reconstruction of Scalable Transformers' FLOPs (docs/scalable_transformer.md).
TABLE1_ATTENTION_POSITIONS = 512
_LAYER = re.compile(r"\.(encoder|decoder)\.layers\.\d+$")


def count_table1_flops(model, src_len: int = 20, tgt_len: int = 20,
                       positions: int = TABLE1_ATTENTION_POSITIONS) -> int:
    """Our reconstruction of the FLOPs of Gao et al. (2021), Tables 1, 7 and 8, for a scalable
    model's active sub-Transformer: 2 × the multiply-accumulates of the linear maps of the 12
    layers on a ``src_len`` + ``tgt_len`` teacher-forced pair (measured; embeddings, I/O
    projections and the softmax layer not counted, as the paper's FLOPs do not change with them),
    plus 2 × the attention products QK^T and AV over ``positions`` × ``positions`` per attention
    (analytic). It fits the paper's 13 values within 2%; the paper does not say how it counted."""
    counter = FlopCounterMode(display=False)
    src, prev = _sentence_pair(model.eval(), src_len, tgt_len)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        model(src, torch.tensor([src_len]), prev)
    linear = sum(n for name, ops in counter.get_flop_counts().items() if _LAYER.search(name)
                 for op, n in ops.items() if "bmm" not in str(op))
    attention = sum(2 * positions ** 2 * attn.active_dim for layer in model.all_layers()
                    for attn in (layer.self_attn, layer.encoder_attn) if attn is not None)
    return linear + 2 * attention


def sub_transformer_param_counts(model) -> dict:
    """``param_counts`` of the active sub-Transformer of a scalable model (its cropped tensors)."""
    groups, seen = {"params_embedding": 0, "params_encoder": 0, "params_decoder": 0}, set()
    for name, tensor in model.sub_transformer_state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            group = "params_embedding" if "embed_tokens" in name else f"params_{name.split('.')[0]}"
            groups[group] += tensor.numel()
    return {"params": sum(groups.values()), **groups}


def model_stats(arch: str, argv=(), vocab_size: int = 32000, src_len: int = 20, tgt_len: int = 20,
                eval_width: int = 0, layer_widths=None) -> dict:
    """Build ``arch`` (flags ``argv``) on a joined vocabulary of ``vocab_size`` and count it; with
    ``eval_width``, the sub-Transformer of that width (and ``layer_widths``) of a scalable model.

    Raises:
        ValueError: on a bad flag value, or ``eval_width`` for an arch without sub-Transformers.
    """
    model = build_model(arch, argv, vocab_size=vocab_size)
    if eval_width:
        if not hasattr(model, "set_sample_config"):
            raise ValueError(f"--eval-width needs a scalable_transformer arch, not {arch!r}")
        model.set_sample_config(eval_width, layer_widths)
    counts = sub_transformer_param_counts(model) if eval_width else param_counts(model)
    stats = {"arch": arch, "vocab_size": vocab_size, **counts}
    stats["macs"] = count_macs(model, src_len, tgt_len)
    stats["macs_decode"] = count_decode_macs(model, src_len, tgt_len)
    if hasattr(model, "set_sample_config"):
        stats["flops_table1"] = count_table1_flops(model, src_len, tgt_len)
    return stats


#: Operators at which the host waits for the device to read a result (a value, or a shape that
#: depends on the data); ``index.Tensor`` only with a boolean index (a hidden ``nonzero``).
HOST_WAIT_OPERATORS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim",
                       "unique_consecutive", "repeat_interleave", "is_nonzero", "equal", "bincount"}
#: Operators that add into their output with atomic adds on a GPU (scatter-adds, in either pass).
ATOMIC_ADD_OPERATORS = {"index_add", "index_add_", "scatter_add", "scatter_add_", "index_put", "index_put_",
                        "_index_put_impl_", "embedding_dense_backward", "scatter_reduce"}


def operator_name(func, args, kwargs) -> str:
    """The name ``OperatorCounter`` counts an ATen call under: ``<name>`` without overload,
    ``index (boolean mask)`` for a boolean index, ``index_put (no accumulate)`` without accumulate."""
    name = func.overloadpacket.__name__
    if name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None):
        name = "index (boolean mask)"
    if name.startswith("index_put") and not (kwargs.get("accumulate") or (len(args) > 3 and args[3])):
        name += " (no accumulate)"
    return name


def is_host_wait(name: str) -> bool:
    return name in HOST_WAIT_OPERATORS or "boolean" in name


class OperatorCounter(TorchDispatchMode):
    """Counts the ATen operators run inside it (forward and, on the CPU, backward: a stand-in for
    device kernel launches), the host waits among them (``HOST_WAIT_OPERATORS``) and the
    atomic-add ones (``ATOMIC_ADD_OPERATORS``; ``index_put`` only with ``accumulate``).
    ``counts`` maps each operator's name (``aten.<name>``, overload dropped) to its calls."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = operator_name(func, args, kwargs)
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **kwargs)

    @property
    def operators(self) -> int:
        return sum(self.counts.values())

    @property
    def host_waits(self) -> int:
        return sum(n for name, n in self.counts.items() if is_host_wait(name))

    @property
    def atomic_adds(self) -> int:
        return sum(n for name, n in self.counts.items() if name in ATOMIC_ADD_OPERATORS)


class HostWaitSites(TorchDispatchMode):
    """Counts the host waits (``is_host_wait``) run inside it by the Python line that made each, the
    innermost frame outside torch: ``sites`` maps ``"path:line"`` to its waits, the path from its
    package down (``fairseq_widearch/modules/moe.py:180``, ``fairseq/modules/...``)."""

    def __init__(self):
        super().__init__()
        self.sites = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_host_wait(operator_name(func, args, kwargs)):
            frame = next(f for f in reversed(traceback.extract_stack()[:-1]) if "/torch/" not in f.filename)
            path = frame.filename.split("site-packages/")[-1]
            site = f"{path[path.rfind('fairseq_widearch/'):] if 'fairseq_widearch/' in path else path}:{frame.lineno}"
            self.sites[site] = self.sites.get(site, 0) + 1
        return func(*args, **kwargs)
