"""Shared fixtures: tiny real data (a slice of Multi30k) and CLI runners."""
import os
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import fairseq_widearch  # noqa: F401  (registers the plugin)
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq_widearch.experiments.settings import criterion, tiny_cases
import warm_python

#: The Python programs the tests start (fairseq-train and the rest) fork from an interpreter that
#: has imported torch and fairseq once (tests/warm_python.py).
warm_python.install()

from testing_utils import REPO, NoMulti30k, find_multi30k

BIN = Path(sys.executable).parent
PLUGIN_MODELS = {cls for name, cls in ARCH_MODEL_REGISTRY.items() if cls.__module__.startswith("fairseq_widearch")}
#: Every architecture the plugin registers, through its `_tiny` preset, and the flags each trains
#: with beyond its arch (the scalable one under its own task, in stage 2).
TINY_CASES = tiny_cases()
TINY_ARCHS = sorted(TINY_CASES)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (tests/cuda; skipped without one): pytest -m cuda")
    config.addinivalue_line("markers", "slow: starts a training process or takes seconds; the fast tier is "
                                       "pytest -m 'not slow and not cuda'")
    # pytest-xdist's, registered here too so that a run without xdist does not warn about it
    config.addinivalue_line("markers", "xdist_group(name): tests one xdist worker runs (--dist loadgroup)")
    config.addinivalue_line("markers", "tier_order(key): where the CUDA tier's test is collected (tests/cuda)")


def pytest_collection_modifyitems(items):
    """The CUDA tier's tests in the order of their ``tier_order`` keys, in the places they hold among
    the collected tests (tests/cuda/test_cuda.py, ARCH_ORDER: the order its workers take them)."""
    slots = [i for i, item in enumerate(items) if item.get_closest_marker("tier_order")]
    ranked = sorted((items[i] for i in slots), key=lambda item: item.get_closest_marker("tier_order").args[0])
    for i, item in zip(slots, ranked):
        items[i] = item


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test ends with the environment it started with. Libraries a test runs in this process
    set variables for good (fairseq's data loader PYTHONWARNINGS, torch's inductor its cache
    directory), which would reach every later test's commands and make the warm interpreter, whose
    variables read at import they no longer match, start them afresh."""
    environment = dict(os.environ)
    yield
    for name in {*os.environ, *environment}:  # only those that differ: never an empty environment
        if name not in environment:
            del os.environ[name]
        elif os.environ.get(name) != environment[name]:
            os.environ[name] = environment[name]


def run(cmd, cwd=None, env=None, timeout=600, input=None):
    """Run a command (``input``: text for its stdin); on failure raise with its output so pytest shows why."""
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
    return BIN / f"fairseq-{tool}"


@pytest.fixture
def grouped_runs_here(monkeypatch):
    """``--moe-dispatch grouped`` runs its own code on the CPU (torch's slow grouped product), where
    the layer would run ``padded`` instead: the tests compare grouped's outputs, not its speed. The
    rows F.grouped_mm leaves undefined (past the last group, in the output and in the input's
    gradient) are NaN, so that a test sees any use of them, where torch's empty memory shows one
    only now and then."""
    from fairseq_widearch.modules import moe
    monkeypatch.setattr(moe, "fast_grouped_mm", lambda tokens, ffn_dim: True)
    monkeypatch.setattr(torch.nn.functional, "grouped_mm", nan_past_last_group(torch.nn.functional.grouped_mm))


def nan_past_last_group(grouped_mm):
    """``grouped_mm`` whose (M, in) x (n, in, out) product has NaN in the rows past ``offs[-1]``,
    of its output and of its first operand's gradient."""
    class Strict(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, offs):
            ctx.save_for_backward(a, b, offs)
            return grouped_mm(a, b, offs=offs).masked_fill_(past(a, offs), float("nan"))

        @staticmethod
        def backward(ctx, grad):
            a, b, offs = ctx.saved_tensors
            with torch.enable_grad():
                a_, b_ = a.detach().requires_grad_(), b.detach().requires_grad_()
                grad_a, grad_b = torch.autograd.grad(grouped_mm(a_, b_, offs=offs), (a_, b_), grad)
            return grad_a.masked_fill_(past(a, offs), float("nan")), grad_b, None

    def past(a, offs):  # (M, 1), without reading offs on the host (the host-wait counts see this)
        return (torch.arange(a.shape[0], device=a.device) >= offs[-1])[:, None]

    def strict(a, b, *, offs=None, **kwargs):
        if a.dim() == 2 and b.dim() == 3 and not kwargs:
            return Strict.apply(a, b, offs)
        return grouped_mm(a, b, offs=offs, **kwargs)
    return strict


@pytest.fixture(scope="session")
def multi30k_dir(request):
    """Raw Multi30k, En-De-Fr-Cs (testing_utils.find_multi30k). Where none is to be had, the run
    stops at the first test that needs it, with one line naming MULTI30K_DIR."""
    try:
        return find_multi30k()
    except NoMulti30k as e:
        message = str(e)
    request.session.shouldstop = message
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def multi30k_bin(tmp_path_factory, multi30k_dir):
    """First 1,000 Multi30k En-De training pairs, 1,000 BPE merges, binarized (joined dictionary)."""
    work = tmp_path_factory.mktemp("multi30k")
    run([sys.executable, REPO / "examples" / "multi30k" / "prepare.py", "--data-dir", multi30k_dir,
         "--work-dir", work, "--max-train-lines", 1000, "--bpe-merges", 1000])
    return work / "bin"


@pytest.fixture(scope="session")
def multi30k_slice_bin(tmp_path_factory, multi30k_bin):
    """The first 100 sentence pairs of each split of ``multi30k_bin``, with its dictionaries, BPE codes
    and test reference (prepare.py's layout): for the tests of a trainer's or the study's mechanics
    (epochs, patience, resuming), where a full epoch, validation or test set only costs time."""
    work, full = tmp_path_factory.mktemp("multi30k_slice"), multi30k_bin.parent

    def head(src, dst):
        dst.write_text("".join(src.read_text().splitlines(keepends=True)[:100]))

    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            head(full / "bpe" / f"{split}.{lang}", work / f"{split}.{lang}")
    head(full / "test.ref.de", work / "test.ref.de")
    (work / "bpe").mkdir()
    shutil.copy(full / "bpe" / "codes", work / "bpe" / "codes")
    run([fairseq_cli("preprocess"), "--source-lang", "en", "--target-lang", "de", "--trainpref", work / "train",
         "--validpref", work / "valid", "--testpref", work / "test", "--srcdict", multi30k_bin / "dict.en.txt",
         "--tgtdict", multi30k_bin / "dict.de.txt", "--destdir", work / "bin", "--workers", 1])
    return work / "bin"


@pytest.fixture(scope="session")
def multi30k_o2m_bin(tmp_path_factory, multi30k_dir):
    """One-to-many en-de, en-fr, en-cs: first 500 training lines, 1,000 BPE merges, one dictionary."""
    work = tmp_path_factory.mktemp("multi30k_o2m")
    run([sys.executable, REPO / "examples" / "multi30k" / "prepare.py", "--data-dir", multi30k_dir,
         "--work-dir", work, "--tgt", "de,fr,cs", "--max-train-lines", 500, "--bpe-merges", 1000])
    return work / "bin"


TRAIN_FLAGS = ["--cpu", "--num-workers", "0", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "1024",
               "--label-smoothing", "0.1", "--seed", "1",
               "--log-format", "simple", "--log-interval", "1", "--no-epoch-checkpoints", "--disable-validation"]


def criterion_for(arch):
    """``--criterion`` flags for ``arch``: the criterion of its auxiliary losses, else label-smoothed CE."""
    return ["--criterion", criterion(arch)]


def train(data, save_dir, arch, *extra, cwd=None, user_dir=None, max_update=3, validate=False):
    """fairseq-train ``arch`` (criterion from :func:`criterion_for` unless ``extra`` names one)."""
    flags = TRAIN_FLAGS if not validate else [f for f in TRAIN_FLAGS if f != "--disable-validation"]
    criterion = [] if "--criterion" in extra else criterion_for(arch)
    return run([fairseq_cli("train"), data, "--user-dir", user_dir or REPO / "fairseq_widearch", "--arch", arch,
                "--save-dir", save_dir, "--max-update", max_update, *flags, *criterion, *extra], cwd=cwd)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, multi30k_bin):
    """``arch -> directory`` holding ``checkpoint_last.pt`` of 2 updates on ``multi30k_bin``,
    trained once per test run and shared by the tests that only need some trained model."""
    trained = {}

    def get(arch):
        if arch not in trained:
            trained[arch] = tmp_path_factory.mktemp(arch)
            train(multi30k_bin, trained[arch], arch, max_update=2)
        return trained[arch]

    return get


def ddp_train(data, tmp_path, arch, *extra, max_update=3, backend="legacy_ddp", worker="ddp_worker.py"):
    """Train ``arch`` with 2 CPU data-parallel ranks (gloo; ``backend`` legacy_ddp, or pytorch_ddp:
    PyTorch's DistributedDataParallel, fairseq's default, no unused-parameter search), each saving
    its own checkpoint; ``worker``: the entry point in tests/helpers. Returns (the two ranks' final state dicts, their outputs)."""
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
    # both ranks at once, each by subprocess.run (served by the warm interpreter)
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda cmd: subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                          text=True, timeout=600), commands))
    outs = [p.stdout for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    return [torch.load(tmp_path / f"rank{r}" / "checkpoint_last.pt")["model"] for r in range(2)], outs
