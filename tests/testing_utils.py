"""What the tests share besides fixtures (tests/conftest.py): the repository, where the tests find
raw Multi30k, fairseq's command-line tools run in this process as fairseq's own tests run them,
and the few commands that need a process of their own."""
import contextlib
import fileinput
import importlib
import io
import json
import logging
import math
import os
import runpy
import socket
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from filelock import FileLock

import fairseq_widearch  # noqa: F401  (registers the plugin and applies its fixes, as --user-dir does)
from fairseq_widearch.cli.export_subnet import build, export_model
from fairseq_widearch.criterions.latent_depth_label_smoothed_cross_entropy import bernoulli_kl
from fairseq_widearch.experiments.scoring import generate_args
from fairseq_widearch.experiments.settings import criterion, multi30k_presets, plugin_archs, tiny_cases
from fairseq_widearch.model_builder import build_model, parse_arch_args
from fairseq_widearch.models.base import use_causal_kernel

REPO = Path(__file__).resolve().parents[1]

BIN = Path(sys.executable).parent
PLUGIN_MODELS = {cls for name, cls in ARCH_MODEL_REGISTRY.items() if cls.__module__.startswith("fairseq_widearch")}
#: The plugin's architectures by their model names (``--arch`` of the base preset), from fairseq's registry.
PLUGIN_ARCHS = plugin_archs()
#: Every architecture's Multi30k preset.
MULTI30K_PRESETS = multi30k_presets()
#: Every architecture the plugin registers, through its `_tiny` preset, and the flags each trains
#: with beyond its arch (the scalable one under its own task, in stage 2).
TINY_CASES = tiny_cases()
TINY_ARCHS = sorted(TINY_CASES)
TRAIN_FLAGS = ["--cpu", "--num-workers", "0", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "1024",
               "--label-smoothing", "0.1", "--seed", "1",
               "--log-format", "simple", "--log-interval", "1", "--no-epoch-checkpoints", "--disable-validation"]

#: Where the quick start (examples/multi30k/quickstart.sh, its default --work-dir) downloads raw Multi30k.
QUICKSTART_RAW = REPO / "runs" / "multi30k" / "data" / "raw"
#: Where the tests download it when neither $MULTI30K_DIR nor the quick start's copy is there.
CACHE_RAW = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fairseq_widearch" / "multi30k"
#: The languages the tests read: En-De, and French and Czech for the one-to-many tests.
LANGS = ("en", "de", "fr", "cs")


class NoMulti30k(Exception):
    """Raw Multi30k is neither named, nor at hand, nor downloadable."""


def find_multi30k(environ=os.environ, quickstart=QUICKSTART_RAW, cache=CACHE_RAW, langs=("en", "de")):
    """The directory of raw Multi30k (``{train,val,test_2016_flickr}.{langs}``) the tests read:
    ``$MULTI30K_DIR`` when set; else the quick start's download, completed with the languages it
    lacks; else the public release, downloaded once into ``cache`` (prepare.py's own download,
    which fetches only the files absent). Raises NoMulti30k, one line naming MULTI30K_DIR, where
    $MULTI30K_DIR lacks a file or a download is needed and fails."""
    import prepare  # the recipes' own download (examples/multi30k)

    expected = f"{{{','.join(prepare.SPLITS.values())}}}.{{{','.join(langs)}}}"
    if environ.get("MULTI30K_DIR"):
        raw = Path(environ["MULTI30K_DIR"])
        missing = [f"{name}.{lang}" for name in prepare.SPLITS.values() for lang in langs
                   if not (raw / f"{name}.{lang}").is_file()]
        if missing:
            raise NoMulti30k(f"MULTI30K_DIR={raw} lacks {', '.join(missing)}: set it to a local copy of "
                             f"Multi30k's raw text, {expected}")
        return raw
    raw = quickstart if quickstart.is_dir() else cache
    try:
        with FileLock(Path(tempfile.gettempdir()) / "fairseq_widearch_multi30k.lock"):  # one download at a time
            return prepare.download(raw, langs)
    except OSError as e:
        raise NoMulti30k(f"the tests need raw Multi30k: set MULTI30K_DIR to a local copy of its raw text, "
                         f"{expected} ({e})") from None


@dataclass
class Output:
    """What a tool run in this process wrote: its log lines and prints (``stdout``), its warnings
    and error messages (``stderr``), and its exit status as its process would have it."""
    stdout: str
    stderr: str = ""
    returncode: int = 0


@contextlib.contextmanager
def _as_program(name, argv, stdin=None):
    """``sys.argv`` as a program called ``name`` with ``argv`` sees it, ``stdin`` its input, and
    (stdout, stderr) collected into the two StringIO objects it yields."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(sys, "argv", [name, *argv]), mock.patch.object(sys, "stdin", io.StringIO(stdin or "")):
        yield out, err


def cli(module, *args):
    """``python -m <module> args`` in this process (``module``: its name, or the module loaded from a
    script): the module's ``main(argv)``, its prints and messages captured. An exit (argparse's
    errors, ``sys.exit(message)``) is its Output's ``returncode``, the message in ``stderr`` as
    Python prints it; other errors raise. The state fairseq keeps is cleared as after
    :func:`fairseq` (the benchmarks and recipes run its tasks and trainers)."""
    code = 0
    argv = [str(a) for a in args]
    module = importlib.import_module(module) if isinstance(module, str) else module
    with _fairseq_state_kept(), _as_program(f"python -m {module.__name__}", argv) as (out, err):
        try:
            module.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
    return Output(out.getvalue(), err.getvalue(), code)


def benchmark(name, *args) -> dict:
    """``benchmarks/<name>.py args`` in this process (:func:`cli`): the JSON line it ends with. An
    exit status raises AssertionError with its output."""
    out = cli(name, *args)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def decode(data, checkpoint, out, *args, **kwargs):
    """The recipes' fairseq-generate (``scoring.generate_args``: beam search, Moses and subword-nmt
    undone) in this process, its output written to ``out``; its Output."""
    decoded = fairseq("generate", *generate_args(data, checkpoint, *args, **kwargs))
    Path(out).write_text(decoded.stdout)
    return decoded


def fairseq(tool, *args, stdin=None, cwd=None, as_main=False):
    """``fairseq-<tool> args`` in this process: the function its console script calls
    (``fairseq_cli.<tool>.cli_main``) on ``args``, as fairseq's own tests run train and generate;
    ``as_main``: ``python -m fairseq_cli.<tool> args`` instead, the module run afresh as ``__main__``
    (``runpy``), so that its ``main`` calls that copy's functions, as in its process.
    Returns its Output: prints in ``stdout``, warnings in ``stderr``, log lines where its process
    writes them (fairseq-train: stdout; the other tools, whose ``import fairseq`` sets up logging
    first: stderr). An exit status raises AssertionError with the tool's stderr; any other error
    raises as the tool raised it, with the output's tails as a note. The state the tool leaves is
    cleared (_fairseq_state_kept)."""
    module = importlib.import_module(f"fairseq_cli.{tool.replace('-', '_')}")
    program = f"python -m {module.__name__}" if as_main else f"fairseq-{tool}"
    if tool in DECODERS and "--help" not in args and not {"--num-workers", "--num_workers"} & set(map(str, args)):
        args = (*args, "--num-workers", 0)  # a loader process outlives its iterator here by up to 5 s (torch's poll)
    with _fairseq_state_kept(), warnings.catch_warnings(record=True) as caught, contextlib.chdir(cwd or os.getcwd()), \
            _as_program(program, map(str, args), stdin) as (out, err):
        warnings.simplefilter("always")
        handler = logging.StreamHandler(out if tool == "train" else err)
        handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                                               "%Y-%m-%d %H:%M:%S"))
        root = logging.getLogger()
        root.addHandler(handler)  # beside pytest's own, which report the lines of a failed test
        root.setLevel(logging.INFO)  # fairseq_cli's basicConfig, as in its process
        try:
            runpy.run_module(module.__name__, run_name="__main__", alter_sys=True) if as_main else module.cli_main()
        except SystemExit as e:  # argparse's errors, fairseq's sys.exit: as run() reports an exit status
            if e.code:
                raise AssertionError(f"{program} exited {e.code}\n{err.getvalue()}") from None
        except Exception as e:
            e.add_note(f"--- {program}'s stdout ---\n{out.getvalue()[-3000:]}\n"
                       f"--- its stderr ---\n{err.getvalue()[-3000:]}")
            raise
        finally:
            err.writelines(f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}\n" for w in caught)
    return Output(out.getvalue(), err.getvalue())


#: The tools that decode with a data loader: in this process, its worker process (fairseq's default
#: ``--num-workers 1``) ends only when torch's shutdown poll comes round, up to 5 s after the run.
DECODERS = ("generate", "interactive", "validate")


#: fairseq's functions that keep a run's state on themselves (the best validation loss, the
#: validations since it), which a new process starts without: (module, function, attributes).
FUNCTION_STATE = [("fairseq_cli.train", "should_stop_early", ("best", "num_runs")),
                  ("fairseq.checkpoint_utils", "save_checkpoint", ("best",))]


def _clear_function_state():
    for module, function, attributes in FUNCTION_STATE:
        function = getattr(importlib.import_module(module), function)
        for attribute in attributes:
            if hasattr(function, attribute):
                delattr(function, attribute)


@contextlib.contextmanager
def _fairseq_state_kept():
    """A run starts as in a process of its own, without the state fairseq keeps on its functions
    (FUNCTION_STATE), and leaves none: that state and fairseq's metrics cleared, its prefetching
    threads stopped (a run that ends at --max-update mid-epoch leaves one blocked on a full queue),
    fileinput closed (fairseq-interactive's input), and the environment and every logger's
    handlers and level as they were (fairseq's data loader sets PYTHONWARNINGS for good;
    fairseq-preprocess adds a handler writing to its --destdir per call)."""
    from fairseq.logging import metrics

    from fairseq_widearch import fairseq_fixes

    _clear_function_state()
    environ = dict(os.environ)
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in logging.Logger.manager.loggerDict)]
    saved = [(logger, logger.handlers[:], logger.level) for logger in loggers]
    try:
        yield
    finally:
        _clear_function_state()
        metrics.reset()
        fairseq_fixes._stop_prefetching()
        fileinput.close()
        for name in {*os.environ, *environ}:  # only those that differ: never an empty environment
            if name not in environ:
                del os.environ[name]
            elif os.environ.get(name) != environ[name]:
                os.environ[name] = environ[name]
        for logger, handlers, level in saved:
            for added in set(logger.handlers) - set(handlers):
                added.close()
            logger.handlers[:], logger.level = handlers, level


def criterion_for(arch):
    """``--criterion`` flags for ``arch``: the criterion of its auxiliary losses, else label-smoothed CE."""
    return ["--criterion", criterion(arch)]


def train(data, save_dir, arch, *extra, cwd=None, user_dir=None, max_update=3, validate=False):
    """fairseq-train ``arch`` in this process (criterion from :func:`criterion_for` unless ``extra``
    names one); its Output."""
    flags = TRAIN_FLAGS if not validate else [f for f in TRAIN_FLAGS if f != "--disable-validation"]
    criterion = [] if "--criterion" in extra else criterion_for(arch)
    return fairseq("train", data, "--user-dir", user_dir or REPO / "fairseq_widearch", "--arch", arch,
                   "--save-dir", save_dir, "--max-update", max_update, *flags, *criterion, *extra, cwd=cwd)


def run(cmd, cwd=None, env=None, timeout=600, input=None):
    """Run a command in a process of its own (``input``: text for its stdin); on failure raise with
    its output so pytest shows why."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, input=input)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                             f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    return proc


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for a rendezvous the test starts next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fairseq_cli(tool):
    """The console script of ``fairseq-<tool>``, for a test whose subject is its process."""
    return BIN / f"fairseq-{tool}"


def ddp_train(data, tmp_path, arch, *extra, max_update=3, backend="legacy_ddp", worker="ddp_worker.py"):
    """Train ``arch`` with 2 CPU data-parallel ranks (gloo; ``backend`` legacy_ddp, or pytorch_ddp:
    PyTorch's DistributedDataParallel, fairseq's default, no unused-parameter search), each saving
    its own checkpoint; ``worker``: the entry point in tests/helpers. Returns (the two ranks' final
    state dicts, their outputs)."""
    port = free_port()
    commands = []
    for rank in range(2):
        (tmp_path / f"rank{rank}").mkdir()  # fairseq creates the save dir on the master only
        cmd = [sys.executable, REPO / "tests" / "helpers" / worker, data,
               "--user-dir", REPO / "fairseq_widearch", "--arch", arch, "--save-dir", tmp_path / f"rank{rank}",
               "--max-update", max_update, "--cpu", "--num-workers", "0", "--optimizer", "adam", "--lr", "0.001",
               "--max-tokens", "512", "--seed", "1", "--disable-validation", "--no-epoch-checkpoints",
               "--ddp-backend", backend, "--distributed-backend", "gloo", "--distributed-world-size", "2",
               "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-rank", str(rank),
               "--distributed-no-spawn", "--device-id", "0", *([] if "--criterion" in extra else criterion_for(arch)),
               *extra]
        commands.append([str(c) for c in cmd])
    # both ranks at once
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda cmd: subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                          text=True, timeout=600), commands))
    outs = [p.stdout for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    return [torch.load(tmp_path / f"rank{r}" / "checkpoint_last.pt")["model"] for r in range(2)], outs


#: Model-level tests' vocabulary and batches (fresh models on random tokens).
VOCAB = 40
PAD = 1


def batch(seed=0, bsz=3, src_len=7, tgt_len=6):
    """A left-padded source batch and a right-padded target prefix, as fairseq's translation task makes."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (bsz, src_len), generator=g)
    src_lengths = torch.tensor([src_len - 2] + [src_len] * (bsz - 1))
    src[0, :2] = PAD
    prev = torch.randint(4, VOCAB, (bsz, tgt_len), generator=g)
    prev[:, 0] = 2  # eos starts every target prefix
    return src, src_lengths, prev


#: The flags that make a tiny preset's own self-attention comparable with fairseq's masks:
#: PartialFormer's without A^G and head scaling.
COMPARABLE_SELF_ATTENTION = {"partialformer_tiny": ["--no-global-attention", "--decoder-heads", "4"]}


def _own_self_attention(arch: str) -> bool:
    """Whether ``arch``'s decoder layers hold a ``self_attn`` (what the causal kernel replaces,
    ``models.base.use_causal_kernel``) that is not fairseq's MultiheadAttention."""
    from fairseq.modules import MultiheadAttention
    attention = getattr(build_model(arch, vocab_size=VOCAB).decoder.layers[0], "self_attn", None)
    return attention is not None and type(attention) is not MultiheadAttention


#: The tiny presets whose decoder self-attention is the plugin's own module (found by building each;
#: WideNet and latent depth use fairseq's MultiheadAttention) -> the flags that make it comparable.
OWN_SELF_ATTENTION = {arch: COMPARABLE_SELF_ATTENTION.get(arch, []) for arch in TINY_ARCHS if _own_self_attention(arch)}


def right_padded_batch(bsz=4, src_len=7, tgt_len=8):
    """A left-padded source batch and target prefixes of lengths tgt_len, tgt_len - 3, ... padded on the right."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB, (bsz, src_len), generator=g)
    src[0, :2] = PAD
    lengths = src.ne(PAD).sum(1)
    prev = torch.randint(4, VOCAB, (bsz, tgt_len), generator=g)
    prev[:, 0] = 2
    for i in range(1, bsz):
        prev[i, tgt_len - 2 * i:] = PAD
    return src, lengths, prev


PRE_NORM = ["--encoder-normalize-before", "--decoder-normalize-before"]
VARIANTS = {"post-norm, projections": [], "pre-norm, projections": PRE_NORM,
            "post-norm, I/O cropping": ["--no-io-projections"],
            "pre-norm, I/O cropping": ["--no-io-projections", *PRE_NORM]}
SUB_TRANSFORMERS = {"type-1 C=64": (64, None), "type-2 D=64,128,128,64": (128, [64, 128, 128, 64]),
                    "type-2 D=64 at C=128": (128, [64, 64, 64, 64])}


def parent_and_export(variant, sub_transformer):
    torch.manual_seed(0)
    args = parse_arch_args("scalable_transformer_tiny", VARIANTS[variant])
    parent = build(args, VOCAB, VOCAB)
    parent.set_sample_config(*SUB_TRANSFORMERS[sub_transformer])
    exported, exported_args = export_model(parent, args)
    loaded = build(exported_args, VOCAB, VOCAB)
    loaded.load_state_dict(exported.state_dict())  # fairseq's load: upgrade_state_dict, then the weights
    return parent, loaded


# The CUDA tier's checks as functions of the device and dtype: the tier runs them in fp16 on the
# GPU (tests/cuda/test_cuda.py), every CI run in bf16 on the CPU (tests/test_bf16.py), so that what
# fails later on the GPU is CUDA's alone. Each returns the figure it measured, for the tier's report.

#: |incremental − full| and |causal kernel − additive masks| log-probabilities: half an ulp at
#: |log p| ≈ 8 is 0.004 in fp16 (11-bit mantissa), 0.03 in bf16 (8 bits).
LOGPROB_TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 8e-2}


def incremental_against_full(arch: str, device: str, dtype: torch.dtype) -> float:
    """Largest |log p| difference between incremental and full decoding of a fresh ``arch``."""
    torch.manual_seed(0)
    model = build_model(arch, vocab_size=VOCAB).to(device=device, dtype=dtype).eval()
    src, lengths, prev = (t.to(device) for t in batch())
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        decoded = model.decoder(prev, encoder_out=encoder_out)
        assert decoded[0].dtype == dtype  # fairseq's log-softmax returns fp32 whatever the logits' dtype
        full = model.get_normalized_probs(decoded, log_probs=True)
        state, steps = {}, []
        for t in range(prev.size(1)):
            out = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
            steps.append(model.get_normalized_probs(out, log_probs=True))
    return (full.float() - torch.cat(steps, dim=1).float()).abs().max().item()


def causal_kernel_against_masks(arch: str, device: str, dtype: torch.dtype) -> float:
    """Decoder self-attention on SDPA's own causal mask against fairseq's additive masks, right-padded
    targets, training mode without dropout: the largest |log p| difference at the real positions."""
    torch.manual_seed(0)
    model = build_model(arch, ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0",
                               *OWN_SELF_ATTENTION[arch]], vocab_size=VOCAB).to(device=device, dtype=dtype).train()
    src, lengths, prev = (t.to(device) for t in right_padded_batch())
    out = {}
    for fused in (False, True):
        use_causal_kernel(model.decoder, fused)
        with torch.no_grad():
            out[fused] = model(src, lengths, prev)[0].float().log_softmax(-1)[prev.ne(1)]
    return (out[True] - out[False]).abs().max().item()


def fp32_islands(device: str, dtype: torch.dtype):
    """The MoE router's losses, the Gumbel-sigmoid samples, q(z = 1) and the KL stay fp32 in a
    half-precision model (docs/widenet.md, docs/latent_depth_transformer.md), in training mode."""
    torch.manual_seed(0)
    src, lengths, prev = (t.to(device) for t in batch())
    widenet = build_model("widenet_tiny", vocab_size=VOCAB).to(device=device, dtype=dtype).train()
    logits, extra = widenet(src, lengths, prev)
    assert logits.dtype == dtype and torch.isfinite(logits).all()
    assert all(loss.dtype == torch.float32 for loss in extra["moe_balance_loss"])
    latent = build_model("latent_depth_transformer_tiny", vocab_size=VOCAB).to(device=device, dtype=dtype).train()
    logits, extra = latent(src, lengths, prev)
    assert logits.dtype == dtype and torch.isfinite(logits).all()
    probs, samples = extra["latent_probs_decoder"][0], extra["latent_samples_decoder"][0]
    assert probs.dtype == samples.dtype == torch.float32 and probs.device.type == device
    assert bernoulli_kl(probs, 0.5).dtype == torch.float32


#: The tier's training flags (lr 0.005, inverse-sqrt with 100 warm-up updates, 4,096 tokens), less
#: ``--max-update`` and the precision.
TIER_TRAIN_FLAGS = ["--num-workers", "0", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.005",
               "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--max-tokens", "4096",
               "--label-smoothing", "0.1", "--seed", "1", "--log-format", "json", "--no-epoch-checkpoints",
               "--disable-validation"]
#: The tier's updates per precision: the checkpoints of fp16 and bf16 are decoded, so they train to
#: a model that translates (600 updates: 14.4 BLEU for multi-path in fp32); the memory-efficient fp16
#: and AMP trainings are only checked by :func:`check_training` (finite figures, a loss 1 bit lower,
#: the loss scale), for which the short schedule is enough: its warm-up and 100 updates after it.
TIER_UPDATES = {"fp16": 600, "bf16": 600, "memory_efficient_fp16": 200, "amp": 200}
TIER_LOG_INTERVAL = 25
#: fairseq-generate's flags that decode the first of two shards of a set's batches (every other
#: batch of 128 sentences: 512 of test_2016's 1,000), scored with ``corpus_bleu(..., part=True)``.
DECODE_HALF = ["--distributed-world-size", "2", "--distributed-rank", "0"]


def check_training(stats: list):
    """Every logged figure finite, the mean loss of the last 3 logs at least 1 below that of the first
    3, and an fp16 loss scale never under 1 (fairseq starts at 128 and stops at --min-loss-scale 1e-4:
    a scale under 1 means the gradients overflowed fp16 over and over). Returns (losses, scales)."""
    for record in stats:
        for key, value in record.items():
            assert math.isfinite(value), f"{key} = {value} at {record}"
    losses = [r["loss"] for r in stats]
    scales = [r["loss_scale"] for r in stats if "loss_scale" in r]  # bf16 needs no loss scale
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.0, losses
    assert min(scales, default=1.0) >= 1.0, scales
    return losses, scales


# ---- fairseq started every way a user starts it (the fixes' matrix, tests/test_fairseq_fixes.py) ----

def dummy_translation_data(directory, sentences=37, vocab=30, seed=0):
    """Random en-de sentence pairs, ``sentences`` per split (37: not a multiple of the default
    --required-batch-size-multiple 8), binarized with a joined dictionary by fairseq-preprocess in
    this process, as fairseq's own tests/utils.py makes its dummy data; -> the data directory."""
    import random
    rng, directory = random.Random(seed), Path(directory)
    words = [f"w{i}" for i in range(vocab)]
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            (directory / f"{split}.{lang}").write_text(
                "".join(" ".join(rng.choices(words, k=rng.randint(3, 12))) + "\n" for _ in range(sentences)))
    fairseq("preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", directory / "train",
            "--validpref", directory / "valid", "--testpref", directory / "test", "--joined-dictionary",
            "--destdir", directory / "bin", "--workers", 1)
    return directory / "bin"


#: The hydra config groups a fairseq-train flag is looked up in, in this order.
HYDRA_GROUPS = ("common", "checkpoint", "optimization", "dataset", "distributed_training", "task", "model",
                "criterion", "optimizer", "lr_scheduler", "bmuf")
#: The groups whose component is named (``_name``), and the flags that name them.
HYDRA_NAMED = {"task": "task", "model": "arch", "criterion": "criterion", "optimizer": "optimizer",
               "lr_scheduler": "lr_scheduler"}


def hydra_config(args, directory) -> list:
    """fairseq-train's command line ``args`` (the data directory first) as fairseq-hydra-train's: a
    config in ``directory`` naming the task, model, criterion, optimizer and scheduler, and each other
    flag given as an override, at the value fairseq's own parser gives it, in the first config group
    that has it. -> fairseq-hydra-train's arguments."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    args = [str(a) for a in args]
    namespace = options.parse_args_and_arch(options.get_training_parser(), args)
    cfg = convert_namespace_to_omegaconf(namespace)
    named = {group: {"_name": getattr(namespace, flag)} for group, flag in HYDRA_NAMED.items()}
    (Path(directory) / "run.yaml").write_text(OmegaConf.to_yaml({**named, "task": {**named["task"], "data": args[0]}}))
    overrides = []
    for flag in (a for a in args[1:] if a.startswith("--") and a[2:].replace("-", "_") not in HYDRA_NAMED.values()):
        key = flag[2:].replace("-", "_")
        group = next(g for g in HYDRA_GROUPS if OmegaConf.is_config(cfg.get(g)) and key in cfg[g])
        overrides.append(f"++{group}.{key}={json.dumps(OmegaConf.to_container(cfg[group], resolve=True)[key])}")
    return ["--config-dir", directory, "--config-name", "run", *overrides, f"hydra.run.dir={directory}"]


#: torchrun's and fairseq's spawn's workers: two, on the CPU with gloo.
WORKERS = 2
DISTRIBUTED = ["--distributed-backend", "gloo"]


def launch(launcher, *args, tmp_path=None, stdin=None) -> Output:
    """fairseq-train's (or, for a decoding launcher, fairseq-generate's or fairseq-interactive's, with
    ``stdin``) command line ``args`` run by ``launcher`` (``fairseq_fixes.TRAINING``, ``DECODING``):
    in this process where the launcher allows (its console script, ``python -m`` as ``__main__``,
    fairseq-hydra-train with the same settings as its config, in a directory under ``tmp_path``), in
    processes where the process is the subject (torchrun; fairseq's own spawn,
    ``tests/helpers/spawn_train.py``). Never raises: an error is a non-zero ``returncode``, its
    message in ``stderr``."""
    args = [str(a) for a in args]
    if launcher in ("torchrun", "spawn"):
        command = ([BIN / "torchrun", "--nproc-per-node", WORKERS, "--master-port", free_port(), "-m", "fairseq_cli.train"]
                   if launcher == "torchrun" else
                   [sys.executable, REPO / "tests" / "helpers" / "spawn_train.py", "--distributed-world-size", WORKERS])
        proc = subprocess.run([str(c) for c in [*command, *args, *DISTRIBUTED]], capture_output=True, text=True,
                              timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        return Output(proc.stdout, proc.stderr, proc.returncode)
    tool, as_main = {"fairseq-train": ("train", False), "python -m fairseq_cli.train": ("train", True),
                     "fairseq-hydra-train": ("hydra-train", False), "fairseq-generate": ("generate", False),
                     "python -m fairseq_cli.generate": ("generate", True),
                     "fairseq-interactive": ("interactive", False)}[launcher]
    if launcher == "fairseq-hydra-train" and "--help" not in args:
        args = hydra_config(args, tempfile.mkdtemp(dir=tmp_path))
    try:
        return fairseq(tool, *args, stdin=stdin, as_main=as_main)
    except Exception as e:
        return Output("\n".join(getattr(e, "__notes__", [])), f"{type(e).__name__}: {e}", 1)
