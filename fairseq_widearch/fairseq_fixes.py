"""Fixes for fairseq 0.12 that the plugin applies when it is imported (``--user-dir`` or
``import fairseq_widearch``), for every architecture, stock ones included. Each replaces a silent
wrong answer by the right one or by an error; nothing else of fairseq's behaviour changes.

Each fix is declared once, in ``FIXES``, by the ``@fix`` decorator on the function that builds
its replacements: what it replaces (``module:Qual.name``), what it was written for (the source
fingerprints in ``WRITTEN_FOR``), the upstream issue where there is one, and the launchers it is
tested under (``TRAINING``, ``DECODING``). ``apply_fixes`` applies them, each at most once:

* **every launcher**: a function of a ``fairseq_cli`` module is replaced in every copy of that
  module, the imported one and the one that ``python -m``, torchrun or fairseq's spawn runs as the
  program (``__main__``, ``__mp_main__``), whose ``main`` calls its own functions;
* **off switch**: ``FAIRSEQ_WIDEARCH_FIXES`` (read at import) takes ``all`` (the default), ``none``,
  or a comma list of fixes to leave out; an unknown name stops the program with one line naming
  the known ones;
* **pinned**: a fix whose target's source differs from the one it was written for (another fairseq)
  leaves that target as it is and warns once (``FixNotApplied``), naming the fix and the target.

docs/fairseq_fixes.md lists them from ``FIXES`` (``tools/figures.py``).
"""
import atexit
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import logging
import math
import os
import pickle
import queue
import shutil
import signal as signal_module
import sys
import textwrap
import time
import urllib.parse
import warnings
import weakref
import zipfile
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY
from omegaconf import DictConfig, open_dict

from .validation import refuse

ENVIRONMENT = "FAIRSEQ_WIDEARCH_FIXES"
#: The ways fairseq is started that the fixes are tested under: training, then decoding.
TRAINING = ("fairseq-train", "python -m fairseq_cli.train", "torchrun", "spawn", "fairseq-hydra-train")
DECODING = ("fairseq-generate", "python -m fairseq_cli.generate", "fairseq-interactive")
#: The training launchers that run in the test's process (a spy on a class, a copy cut short). A fix
#: tested only there replaces what torchrun's and spawn's workers reach as ``python -m`` does.
IN_PROCESS_TRAINING = ("fairseq-train", "python -m fairseq_cli.train", "fairseq-hydra-train")
#: The attribute naming the fix a replacement belongs to (each replacement keeps what it replaced
#: in ``__wrapped__``, so a chain of fixes on one target is followed to fairseq's own function).
MARK = "__fairseq_widearch_fix__"

#: What the fixes were written for: ``module:Qual.name`` -> the first 12 hex digits of the sha256
#: of that function's or class's source (``fingerprint``) in ve-fairseq 0.12.3.
WRITTEN_FOR = {
    "fairseq.checkpoint_utils:load_checkpoint_to_cpu": "96f7d33cde8e",
    "fairseq.data.data_utils:batch_by_size": "10c0b48b4735",
    "fairseq.trainer:Trainer.__init__": "15dd9cb1abfb",
    "fairseq.trainer:Trainer.save_checkpoint": "39af76675f38",
    "fairseq.trainer:Trainer.load_checkpoint": "31d0e74e6cc6",
    "fairseq_cli.train:train": "db4e58992bbc",
    "fairseq_cli.train:should_stop_early": "deb15b6c0cc2",
    "fairseq_cli.train:main": "2a1b822cd8f5",
    "fairseq.data.iterators:BackgroundConsumer.run": "7c44a8d23bbc",
    "fairseq.optim.amp_optimizer:AMPOptimizer.__init__": "8828ca1673de",
    "fairseq.distributed.utils:call_main": "c2a32fa44fa2",
    "fairseq.models:BaseFairseqModel.prepare_for_inference_": "86639b2e980f",
    "fairseq.distributed.utils:infer_init_method": "340321c1d2a1",
    "fairseq.distributed.utils:distributed_main": "239272195925",
    "fairseq.models.distributed_fairseq_model:DistributedFairseqModel": "caa68bcad9ad",
    "fairseq.distributed.distributed_timeout_wrapper:DistributedTimeoutWrapper.__init__": "22ca26a7cedb",
    "fairseq.file_io:PathManager.copy": "e4ce3f5c1ff0",
    "fairseq.data.iterators:BufferedIterator._create_consumer": "ea6069b92254",
    "fairseq.options:parse_args_and_arch": "535ef0431681",
    "fairseq.tasks.fairseq_task:FairseqTask.build_model": "41525175b483",
    "fairseq.tasks.fairseq_task:FairseqTask.build_criterion": "9919fd4be6e6",
    "fairseq.tasks.fairseq_task:LegacyFairseqTask.build_model": "30e487ace1f0",
    "fairseq.tasks.fairseq_task:LegacyFairseqTask.build_criterion": "2f76963e89cb",
}


class FixNotApplied(UserWarning):
    """A fix left out because what it replaces is not what it was written for."""


@dataclasses.dataclass(frozen=True)
class Fix:
    """One fix: ``build`` takes the current value of each target of ``replaces`` (one module's) and
    returns its replacement (a tuple for several); ``once`` acts once per process, when the fix is
    first applied (all a fix that replaces nothing does); ``pins``: the targets whose source must be
    the one in ``WRITTEN_FOR``; ``launchers``: those it is tested under."""
    name: str
    replaces: Tuple[str, ...]
    pins: Tuple[str, ...]
    launchers: Tuple[str, ...]
    upstream: Optional[str]
    build: Callable
    once: Optional[Callable] = None

    @property
    def why(self) -> str:
        """The first paragraph of the fix's docstring, on one line."""
        return " ".join(inspect.getdoc(self.build).split("\n\n")[0].split())


FIXES: Dict[str, Fix] = {}


def fix(*replaces: str, launchers: Tuple[str, ...], relies_on: Tuple[str, ...] = (), pins: Tuple[str, ...] = None,
        upstream: str = None, once: Callable = None):
    """Declare the decorated builder a fix named after it (see ``Fix``): its pins are what it replaces
    and ``relies_on``, unless ``pins`` names them.

    Raises:
        ValueError: where its targets lie in several modules, or a pin has no ``WRITTEN_FOR`` entry.
    """
    pins = (*replaces, *relies_on) if pins is None else pins
    if len({target.split(":")[0] for target in replaces}) > 1 or set(pins) - set(WRITTEN_FOR):
        raise ValueError(f"a fix replaces what one module holds and pins what WRITTEN_FOR has: {replaces}, {pins}")

    def register(build):
        FIXES[build.__name__] = Fix(build.__name__, replaces, pins, launchers, upstream, build, once)
        return build
    return register


def module_copies(name: str) -> list:
    """Every loaded copy of the module ``name``: the imported one, and the one run as the program
    (``__main__``; ``__mp_main__`` in the workers fairseq spawns) by ``python -m`` or torchrun, or by
    ``python path/to/module.py``."""
    copies = [importlib.import_module(name)]
    for program in ("__main__", "__mp_main__"):
        module = sys.modules.get(program)
        path = getattr(module, "__file__", None)
        same = (getattr(getattr(module, "__spec__", None), "name", None) == name
                or path is not None and os.path.realpath(path) == os.path.realpath(copies[0].__file__))
        if module is not None and same and module not in copies:
            copies.append(module)
    return copies


def owners(target: str) -> list:
    """``(object, attribute)`` holding ``target`` (``module:Qual.name``) in each copy of its module."""
    module, qualname = target.split(":")
    *path, attribute = qualname.split(".")
    found = []
    for owner in module_copies(module):
        for part in path:
            owner = getattr(owner, part)
        found.append((owner, attribute))
    return found


def fixes_on(value) -> set:
    """The fixes whose replacements ``value`` is or wraps."""
    names = set()
    while value is not None:
        names.add(getattr(value, MARK, None))
        value = getattr(value, "__wrapped__", None)
    return names - {None}


def fingerprint(value) -> Optional[str]:
    """The first 12 hex digits of the sha256 of the source of ``value`` under any fix's replacement
    (``inspect.unwrap``); None where its source cannot be read."""
    try:
        source = inspect.getsource(inspect.unwrap(value))
    except (OSError, TypeError):
        return None
    return hashlib.sha256(textwrap.dedent(source).encode()).hexdigest()[:12]


_WARNED = set()


def _differs(target: str) -> Optional[str]:
    """Why ``target`` is not what the fixes were written for, or None where it is."""
    try:
        found = [fingerprint(getattr(owner, attribute)) for owner, attribute in owners(target)]
    except (ImportError, AttributeError):
        return "it is not there"
    if None in found:
        return "its source cannot be read"
    changed = [f for f in found if f != WRITTEN_FOR[target]]
    return (f"its source (sha256 {changed[0]}) differs from the one the fix was written for "
            f"({WRITTEN_FOR[target]}, ve-fairseq 0.12.3)") if changed else None


def _not_applied(fix_: Fix, target: str, reason: str):
    if fix_.name not in _WARNED:
        _WARNED.add(fix_.name)
        warnings.warn(f"fairseq_widearch: fix {fix_.name} not applied: {target}: {reason}; fairseq's own is kept",
                      FixNotApplied, stacklevel=5)


def _pinned(fix_: Fix) -> bool:
    """Whether every target ``fix_`` pins is what it was written for; if not, warn once."""
    for target in fix_.pins:
        reason = _differs(target)
        if reason:
            _not_applied(fix_, target, reason)
            return False
    return True


def _replace(owner, attribute, current, replacement, name):
    """Put ``replacement`` of fix ``name`` in place of ``current`` (a static method stays one)."""
    setattr(replacement, MARK, name)
    if getattr(replacement, "__wrapped__", None) is None:
        replacement.__wrapped__ = current
    if isinstance(inspect.getattr_static(owner, attribute), staticmethod):
        replacement = staticmethod(replacement)
    setattr(owner, attribute, replacement)
    namespace = getattr(inspect.unwrap(current), "__globals__", None)  # (fairseq decorates some)
    if inspect.ismodule(owner) and namespace is not None and namespace is not vars(owner) \
            and namespace.get(attribute) is current:
        # multiprocessing's spawned __mp_main__ holds a copy of the namespace its functions read
        namespace[attribute] = replacement


#: The fixes applied in this process (``once`` done).
APPLIED = set()


def _apply(fix_: Fix):
    if not _pinned(fix_):
        return
    found = []
    for target in fix_.replaces:  # (a replaced target that no pin covers may be gone)
        try:
            found.append([(owner, attribute, getattr(owner, attribute)) for owner, attribute in owners(target)])
        except (ImportError, AttributeError):
            return _not_applied(fix_, target, "it is not there")
    if fix_.name not in APPLIED and fix_.once is not None:
        fix_.once()
    for places in zip(*found):  # one module copy at a time
        currents = [current for _, _, current in places]
        if all(fix_.name in fixes_on(current) for current in currents):
            continue
        built = fix_.build(*currents)
        for (owner, attribute, current), replacement in zip(places, built if len(places) > 1 else [built]):
            if fix_.name not in fixes_on(current):
                _replace(owner, attribute, current, replacement, fix_.name)
    APPLIED.add(fix_.name)


def left_out(name: str, where: str) -> str:
    """For a refusal that fix ``name`` prevents ``where`` (e.g. "under fairseq-hydra-train"): a clause
    naming the fix, where it is not applied in this process (``FAIRSEQ_WIDEARCH_FIXES`` leaves it
    out, or it is pinned to another fairseq), else ''."""
    return "" if name in APPLIED else (f"; {where} it reaches the criterion through the fix {name}, which is "
                                       f"not applied: see {ENVIRONMENT} and the warnings at start-up")


def selected_fixes(setting: str = None) -> list:
    """The fixes ``FAIRSEQ_WIDEARCH_FIXES`` (or ``setting``) selects: ``all`` (also when unset),
    ``none``, or every fix but those of a comma list. An unknown name exits with one line."""
    setting = (os.environ.get(ENVIRONMENT, "all") if setting is None else setting).strip()
    if setting in ("", "all"):
        return list(FIXES)
    if setting == "none":
        return []
    left_out = [name.strip() for name in setting.split(",") if name.strip()]
    unknown = [name for name in left_out if name not in FIXES]
    if unknown:
        raise SystemExit(f"{ENVIRONMENT}={setting}: no fix named {', '.join(unknown)}; it takes all, none, or a "
                         f"comma list of fixes to leave out, of: {', '.join(FIXES)}")
    return [name for name in FIXES if name not in left_out]


_SELECTED = []


def apply_fixes(setting: str = None):
    """Apply the selected fixes (``selected_fixes``), each at most once per target.

    Where one replaces a function of a ``fairseq_cli`` module, ``distributed_utils.call_main`` is
    wrapped to apply it again before ``main`` runs: a program run as ``__main__`` after the plugin was
    imported (``runpy``, a script that imports the plugin first) is a copy the import did not see."""
    _SELECTED[:] = selected_fixes(setting)
    for name in _SELECTED:
        _apply(FIXES[name])
    if any(_replaces_cli(FIXES[name]) for name in _SELECTED):
        from fairseq.distributed import utils as distributed_utils

        if "apply_fixes" not in fixes_on(distributed_utils.call_main):
            _replace(distributed_utils, "call_main", distributed_utils.call_main,
                     _reaching_main(distributed_utils.call_main), "apply_fixes")


def _replaces_cli(fix_: Fix) -> bool:
    """Whether ``fix_`` replaces a function of a ``fairseq_cli`` module."""
    return any(target.startswith("fairseq_cli.") for target in fix_.replaces)


def _reaching_main(call_main):
    @functools.wraps(call_main)
    def reaching_main(*args, **kwargs):
        for name in _SELECTED:
            if _replaces_cli(FIXES[name]):
                _apply(FIXES[name])
        return call_main(*args, **kwargs)
    return reaching_main


# ---- the fixes, in the order they are applied ----

def _allow_globals():
    from .checkpoint_loading import FAIRSEQ_CHECKPOINT_GLOBALS

    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # (torch < 2.4 has no allow-list, and loads without weights_only)
        add(FAIRSEQ_CHECKPOINT_GLOBALS)


@fix(launchers=("fairseq-train", "python -m fairseq_cli.train", "torchrun", "spawn", *DECODING),
     relies_on=("fairseq.checkpoint_utils:load_checkpoint_to_cpu",), once=_allow_globals)
def allow_fairseq_checkpoint_globals():
    """Under torch >= 2.6 (``weights_only=True``) fairseq cannot load the checkpoints it saves (they
    hold an ``argparse.Namespace``): resuming, fairseq-generate, fairseq-interactive and the hub fail.

    Adds to torch's allow-list exactly the classes a fairseq checkpoint holds
    (``checkpoint_loading.FAIRSEQ_CHECKPOINT_GLOBALS``); any other pickled global is still refused
    with torch's ``UnpicklingError``. A no-op on torch < 2.4, which has no allow-list.
    (fairseq-hydra-train's checkpoints hold plain containers: it has no row.)"""


@fix("fairseq.checkpoint_utils:load_checkpoint_to_cpu", launchers=(*IN_PROCESS_TRAINING, *DECODING))
def name_unreadable_checkpoints(load):
    """A checkpoint cut short or corrupted stops resuming and decoding with torch's zip or pickle
    error, which names neither the file nor the cause.

    ``load_checkpoint_to_cpu`` (resume, generate, interactive, the hub) ends a fairseq program in one
    line naming the file instead, and raises ``checkpoint_loading.CheckpointReadError`` elsewhere; a class refused by
    weights-only loading keeps torch's own error, which names the class."""
    from .checkpoint_loading import CheckpointReadError

    @functools.wraps(load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            return load(path, *args, **kwargs)
        except FileNotFoundError:
            raise
        except (RuntimeError, OSError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
            if "GLOBAL" in str(error):  # a class refused by weights-only loading: torch names it
                raise
            reason = str(error).strip().splitlines()[0] if str(error).strip() else "unexpected end of file"
            refuse(f"cannot read checkpoint {path} (truncated or corrupted?): {reason}", CheckpointReadError)

    return load_checkpoint_to_cpu


@fix("fairseq.data.data_utils:batch_by_size", upstream="facebookresearch/fairseq#5036, #5351",
     launchers=(*TRAINING, "fairseq-generate", "python -m fairseq_cli.generate"))
def keep_last_batch(original):
    """fairseq drops the last batch of every epoch, validation pass and decoding run when its size is
    not a multiple of ``--required-batch-size-multiple``: the longest sentences (Multi30k ``val``
    validates 1,008 of its 1,014 sentences).

    ``batch_by_size`` (every task's ``get_batch_iterator``) ends with ``if bsz_mult > 1 and
    len(b[-1]) % bsz_mult != 0: b = b[:-1]``; the remainder is kept as a batch of its own, as
    fairseq 0.12.2 kept it."""

    @functools.wraps(original)
    def batch_by_size(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                      required_batch_size_multiple=1, fixed_shapes=None):
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = original(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                           required_batch_size_multiple, fixed_shapes)
        if fixed_shapes is None:  # batches are consecutive runs of `indices`: what is missing is the tail
            batched = sum(len(batch) for batch in batches)
            if batched < len(indices):
                batches = [*batches, indices[batched:]]
        return batches

    return batch_by_size


def registered_name(criterion) -> str:
    """``criterion``'s ``--criterion`` name (its class name if it has none)."""
    return next((key for key, cls in CRITERION_REGISTRY.items() if type(criterion) is cls), type(criterion).__name__)


def training_criterion_error(task, model, criterion) -> Optional[str]:
    """Why ``criterion`` cannot train ``model`` under ``task``, or None: it would drop the model's
    auxiliary losses (the model names the criterion that adds them in ``auxiliary_criterion``), or
    the task trains with another (``training_criterion``). Each is a registered criterion name;
    subclasses of that criterion qualify too."""
    model = getattr(model, "module", model)  # data-parallel wrappers
    needed = getattr(model, "auxiliary_criterion", None)
    if needed is not None and not isinstance(criterion, CRITERION_REGISTRY[needed]):
        return (f"--criterion {registered_name(criterion)} leaves out {model.auxiliary_losses}, part of the "
                f"training objective: train with --criterion {needed}")
    return getattr(task, "criterion_error", lambda _: None)(criterion)


def alignments_for_criterion(model, criterion):
    """The plugin's decoders compute no attention weights in training unless something reads them
    (``fairseq_widearch.models.base.AlignmentsWhenRead``): tell ``model``'s decoder to, when
    ``criterion`` is fairseq's alignment-supervised one (it reads ``extra["attn"]``)."""
    decoder = getattr(getattr(model, "module", model), "decoder", None)
    if decoder is not None and isinstance(criterion, CRITERION_REGISTRY["label_smoothed_cross_entropy_with_alignment"]):
        decoder.alignments_in_training = True


@fix("fairseq.trainer:Trainer.__init__", launchers=IN_PROCESS_TRAINING)
def require_auxiliary_criterion(original):
    """A model whose objective has auxiliary losses (WideNet's balance loss, latent depth's KL and
    target depth) trains without an error under a criterion that drops them.

    fairseq-train stops when its ``Trainer`` is built, naming the criterion to use
    (``training_criterion_error``: also a task's own criterion); the same hook lets the plugin's decoders compute alignments in
    training where the criterion reads them (``alignments_for_criterion``)."""

    @functools.wraps(original)
    def __init__(self, cfg, task, model, criterion, *args, **kwargs):
        error = training_criterion_error(task, model, criterion)
        if error:
            refuse(error)
        alignments_for_criterion(model, criterion)
        original(self, cfg, task, model, criterion, *args, **kwargs)

    return __init__


def _early_stopping() -> list:
    """fairseq-train's early-stopping function, which keeps its state on itself, in each copy of
    ``fairseq_cli.train`` (``python -m`` runs one as ``__main__``)."""
    return [module.should_stop_early for module in module_copies("fairseq_cli.train")]


@fix("fairseq.trainer:Trainer.save_checkpoint", "fairseq.trainer:Trainer.load_checkpoint", launchers=TRAINING,
     relies_on=("fairseq_cli.train:should_stop_early",))
def resume_patience(save, load):
    """A resumed ``fairseq-train --patience N`` forgets how many validations had not improved: it
    trains up to N validations longer than the same run uninterrupted.

    ``fairseq_cli.train.should_stop_early`` keeps both on the function object, which a new process
    starts afresh. They are stored in the checkpoint's extra state (key ``should_stop_early``) and
    restored on load, under fairseq's own condition for restoring the best checkpoint's loss
    (neither ``--reset-optimizer`` nor ``--reset-meters``, so ``--finetune-from-model`` starts
    afresh)."""

    @functools.wraps(save)
    def save_checkpoint(self, filename, extra_state):
        counted = [stop for stop in _early_stopping() if hasattr(stop, "best")]  # the copy that ran
        if counted:
            extra_state = {**extra_state, "should_stop_early": {"best": counted[-1].best,
                                                                "num_runs": counted[-1].num_runs}}
        save(self, filename, extra_state)

    @functools.wraps(load)
    def load_checkpoint(self, filename, reset_optimizer=False, reset_lr_scheduler=False, optimizer_overrides=None,
                        reset_meters=False):
        extra_state = load(self, filename, reset_optimizer, reset_lr_scheduler, optimizer_overrides, reset_meters)
        state = (extra_state or {}).get("should_stop_early")
        if state is not None and not reset_optimizer and not reset_meters:
            for stop in _early_stopping():
                stop.best, stop.num_runs = state["best"], state["num_runs"]
        return extra_state

    return save_checkpoint, load_checkpoint


@fix("fairseq_cli.train:train", launchers=TRAINING, relies_on=("fairseq_cli.train:main",))
def finished_runs_stay_finished(original):
    """A finished ``fairseq-train`` command run again trains one more update and saves it: every rerun
    of a resumable recipe moves the model on by one update.

    ``fairseq_cli.train.main`` checks ``--max-update`` only after an update; the per-epoch ``train``
    it calls returns fairseq's own "stop" before the first update instead. ``--max-update 0`` (no
    limit) is unaffected."""

    @functools.wraps(original)
    def train(cfg, trainer, task, epoch_itr):
        max_update = cfg.optimization.max_update or math.inf
        if trainer.get_num_updates() >= max_update:
            logging.getLogger("fairseq_cli.train").info(
                f"nothing to train: the checkpoint has {trainer.get_num_updates()} updates, --max-update {max_update}")
            return [None], True
        return original(cfg, trainer, task, epoch_itr)

    return train


@fix("fairseq.optim.amp_optimizer:AMPOptimizer.__init__", launchers=IN_PROCESS_TRAINING)
def amp_loss_scaler_flags(init):
    """``--amp`` starts its loss scale at ``--fp16-init-scale`` instead of ``--amp-init-scale``, and
    ``--amp-scale-window W`` grows the scale every ``--amp-init-scale`` updates instead of every W.

    The scaler is rebuilt with ``--amp-init-scale`` and, when set, ``--amp-scale-window`` (else
    torch's default interval, 2,000, as before); both flags at their defaults give fairseq's."""

    @functools.wraps(init)
    def __init__(self, cfg, params, fp32_optimizer, **kwargs):
        init(self, cfg, params, fp32_optimizer, **kwargs)
        window = getattr(cfg.common, "amp_scale_window", None)
        self._grad_scaler = torch.cuda.amp.GradScaler(init_scale=cfg.common.amp_init_scale,
                                                      **({"growth_interval": window} if window is not None else {}))

    return __init__


@fix("fairseq.distributed.utils:call_main", upstream="facebookresearch/fairseq#4696",
     launchers=("fairseq-train", "python -m fairseq_cli.train"),
     relies_on=("fairseq.options:parse_args_and_arch",))
def bf16_without_tpu(original):
    """``fairseq-train --bf16`` turns on ``--tpu`` and, without torch_xla, dies at start ("'NoneType'
    object has no attribute 'xla_device'"), on a GPU as on a CPU.

    ``options.parse_args_and_arch`` sets ``args.tpu = True`` whenever ``--bf16`` is given; apart from
    that line, fairseq's trainer has a whole bf16 path. At ``call_main`` ``--tpu`` goes back to
    False when ``--bf16`` is on, ``--tpu`` was not on the command line and torch_xla is not
    installed (where it is, ``--bf16`` keeps meaning a TPU, as upstream). fairseq-hydra-train parses
    no command line, so implies no ``--tpu``: it has no row."""

    @functools.wraps(original)
    def call_main(cfg, main, **kwargs):
        implied = cfg.common.bf16 and cfg.common.tpu and "--tpu" not in sys.argv
        if implied and importlib.util.find_spec("torch_xla") is None:
            cfg.common.tpu = cfg.distributed_training.tpu = False  # the latter a copy, not a reference
        return original(cfg, main, **kwargs)

    return call_main


@fix("fairseq.models:BaseFairseqModel.prepare_for_inference_", launchers=DECODING)
def bf16_inference(original):
    """``fairseq-generate --bf16`` (and ``fairseq-interactive``, the hub interface) decodes in fp32,
    ignoring the flag.

    Every inference entry point calls ``model.prepare_for_inference_(cfg)`` once the model is on its
    device: the model is cast to bf16 there. Log-probabilities stay fp32 (fairseq's
    ``log_softmax`` runs in fp32), as with ``--fp16``."""

    @functools.wraps(original)
    def prepare_for_inference_(self, cfg):
        if getattr(getattr(cfg, "common", None), "bf16", False):
            self.to(dtype=torch.bfloat16)
        return original(self, cfg)

    return prepare_for_inference_


#: The variables torchrun (and torch.distributed.launch) sets in every worker it starts.
TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: The init method of torchrun's workers where torchrun shares its rendezvous store with them (its
#: default, static and c10d rendezvous alike): ``env://``'s store, its keys under the attempt's own prefix.
ATTEMPT_INIT_METHOD = "torchrun-attempt://"


def _attempt_rendezvous(url, **kwargs):
    """``env://``'s rendezvous, the store's keys under ``attempt_<TORCHELASTIC_RESTART_COUNT>/``."""
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    rank, world = int(query["rank"][0]), int(query["world_size"][0])
    for store, rank, world in torch.distributed.rendezvous("env://", rank, world, **kwargs):
        yield torch.distributed.PrefixStore(f"attempt_{os.environ['TORCHELASTIC_RESTART_COUNT']}", store), rank, world


def _register_attempt_rendezvous():
    torch.distributed.register_rendezvous_handler(ATTEMPT_INIT_METHOD.split(":")[0], _attempt_rendezvous)


@fix("fairseq.distributed.utils:infer_init_method", upstream="pytorch/pytorch#135712", launchers=("torchrun",),
     relies_on=("fairseq.distributed.utils:call_main",), once=_register_attempt_rendezvous)
def torchrun_joins_one_group(original):
    """Workers started by ``torchrun`` train as independent runs (or, without CUDA, fail) unless
    ``--distributed-world-size`` matches; a group that torchrun restarts (``--max-restarts``) hangs.

    fairseq reads torchrun's variables only when ``--distributed-world-size`` is above 1, and its
    default is the number of local GPUs. Under torchrun's variables the world size and rank come from
    ``WORLD_SIZE`` and ``RANK``, the processes on this machine from ``LOCAL_WORLD_SIZE``, the device
    from ``LOCAL_RANK`` (modulo its GPUs), ``env://`` is the init method, and
    ``--distributed-no-spawn`` is set. torchrun keeps its rendezvous store over restarts without a
    prefix per attempt (torch 2.13), so a restarted group read the lost group's keys: where it
    shares its store, the init method is ``ATTEMPT_INIT_METHOD``, whose keys carry the attempt
    (``TORCHELASTIC_RESTART_COUNT``). Agents of several machines count their restarts apart, so such
    a job stops at its start instead, naming the form that restarts (the c10d rendezvous with
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``).

    Refuses (``validation.refuse``) when ``--distributed-world-size`` differs from ``WORLD_SIZE`` and from its
    default, and when torchrun may restart the workers of several machines sharing its store."""

    @functools.wraps(original)
    def infer_init_method(cfg, force_distributed=False):
        torchrun = all(v in os.environ for v in TORCHRUN_VARIABLES)
        if (not torchrun or cfg.distributed_init_method is not None or cfg.tpu or cfg.pipeline_model_parallel
                or int(os.environ["WORLD_SIZE"]) == 1):  # fairseq's own path (pipelines: its device setup)
            return original(cfg, force_distributed)
        world = int(os.environ["WORLD_SIZE"])
        if cfg.distributed_world_size not in (world, max(1, torch.cuda.device_count())):
            refuse(f"--distributed-world-size {cfg.distributed_world_size} under torchrun's "
                   f"WORLD_SIZE={world}: leave the flag out (the workers torchrun starts are the group)")
        shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        if (shared and int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1
                and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0):
            refuse("torchrun --max-restarts on several machines sharing its rendezvous store: a restart "
                   "would hang; run TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --rdzv-backend c10d ...")
        cfg.distributed_init_method = ATTEMPT_INIT_METHOD if shared else "env://"
        cfg.distributed_world_size, cfg.distributed_rank = world, int(os.environ["RANK"])
        cfg.distributed_num_procs = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        # LOCAL_RANK among the GPUs this worker sees (one, where a launcher gives each its own)
        local, gpus = int(os.environ["LOCAL_RANK"]), torch.cuda.device_count()
        cfg.device_id = local % gpus if gpus else local
        cfg.distributed_no_spawn = True

    return infer_init_method


_fairseq_distributed_main = []


def _distributed_main(i, main, cfg, kwargs):
    """fairseq's ``distributed_main`` after the BMUF config's world size is set (bmuf_world_size).
    A function of this module, so that fairseq's spawned workers, which unpickle it by name, import
    the plugin and run it too."""
    if "bmuf" in cfg:
        cfg.bmuf.distributed_world_size = cfg.distributed_training.distributed_world_size
    return _fairseq_distributed_main[0](i, main, cfg, kwargs)


@fix("fairseq.distributed.utils:distributed_main", launchers=("torchrun",))
def bmuf_world_size(original):
    """Under torchrun or SLURM, ``--use-bmuf`` reads a world size of 1 and never synchronises, and the
    logged config says so.

    fairseq copies ``--distributed-world-size`` into the BMUF config when it parses the command line,
    before the world size is found from torchrun's or SLURM's variables; the copy is made again once
    the world size is known (``distributed_utils.distributed_main``, before ``main``). fairseq's spawn
    is started with the world size on its command line: it has no row."""
    _fairseq_distributed_main[:] = [original]
    return _distributed_main


@fix("fairseq.models.distributed_fairseq_model:DistributedDataParallel",
     pins=("fairseq.models.distributed_fairseq_model:DistributedFairseqModel",), launchers=("torchrun", "spawn"))
def pytorch_ddp_on_cpu(original):
    """``--ddp-backend pytorch_ddp``, fairseq's default, fails on CPU workers: fairseq builds
    PyTorch's ``DistributedDataParallel`` with ``device_ids=[--device-id]``, which PyTorch refuses
    for a module on the CPU.

    For a module whose parameters are all on the CPU the wrapper is built with ``device_ids=None``
    (PyTorch's form for CPU modules); everything else as fairseq passes it."""

    class DistributedDataParallel(original):
        def __init__(self, module, device_ids=None, output_device=None, **kwargs):
            if all(p.device.type == "cpu" for p in module.parameters()):
                device_ids = output_device = None
            super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)

    return DistributedDataParallel


@fix("fairseq.distributed.distributed_timeout_wrapper:DistributedTimeoutWrapper.__init__",
     launchers=("torchrun",))
def heartbeat_ends_a_hung_job(original):
    """``--heartbeat-timeout N`` cannot end a worker that waits in a collective for a hung peer: the
    job waits for the process group's timeout (30 minutes on gloo).

    The watchdog (``DistributedTimeoutWrapper``) sends SIGTERM instead, whose default action ends the
    process wherever it waits; torchrun then stops the group (and starts it again under
    ``--max-restarts``). A signal the caller names is kept."""

    @functools.wraps(original)
    def __init__(self, module, timeout, signal=signal_module.SIGTERM):
        original(self, module, timeout, signal)

    return __init__


@fix("fairseq.file_io:PathManager.copy", launchers=IN_PROCESS_TRAINING)
def checkpoint_copies_are_atomic(original):
    """A kill while fairseq copies a saved checkpoint to ``checkpoint_last.pt`` (or
    ``checkpoint_best.pt``) leaves that file cut short, and the next run cannot resume.

    ``checkpoint_utils.save_checkpoint`` saves the first checkpoint atomically and copies it to the
    others with ``shutil.copyfile``, which truncates the target and writes it in place. The copy goes
    to a temporary file renamed over the target instead. Only local paths change."""

    @functools.wraps(original)
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        from fairseq.file_io import PathManager

        if not PathManager.supports_rename(dst_path):
            return original(src_path, dst_path, overwrite)
        shutil.copyfile(src_path, dst_path + ".tmp")
        os.replace(dst_path + ".tmp", dst_path)
        return True

    return copy


#: The prefetching threads that ``prefetching_stops_at_exit`` stops (held by the thread, not by
#: its iterator, which a validation pass drops while its thread runs on); the longest it waits for
#: them, in seconds (a thread ends after the batch it is collating).
_PREFETCHING = weakref.WeakSet()
PREFETCH_STOP_SECONDS = 10.0


def _stop_prefetching():
    deadline = time.monotonic() + PREFETCH_STOP_SECONDS
    for consumer in list(_PREFETCHING):
        consumer._max_len = 0  # BackgroundConsumer stops after its next put
        while consumer.is_alive() and time.monotonic() < deadline:
            try:  # room in the queue for that put and the sentinel after it
                consumer._queue.get_nowait()
            except queue.Empty:
                consumer.join(0.01)


@fix("fairseq.data.iterators:BufferedIterator._create_consumer", launchers=IN_PROCESS_TRAINING,
     relies_on=("fairseq.data.iterators:BackgroundConsumer.run",), once=lambda: atexit.register(_stop_prefetching))
def prefetching_stops_at_exit(original):
    """``fairseq-train`` stopped mid-epoch (``--max-update``, ``--max-valid-steps``) can abort at exit
    ("terminate called without an active exception", exit status 134) after it has finished and
    saved.

    Each ``BufferedIterator`` (``--data-buffer-size``) prefetches in a daemon thread that collates
    batches with torch operators; where one is inside an operator when the interpreter finalises
    (CPython < 3.14 ends daemon threads with ``pthread_exit``), the process aborts. An ``atexit``
    handler lets each live thread finish its batch and return, for at most
    ``PREFETCH_STOP_SECONDS`` seconds in all."""

    @functools.wraps(original)
    def _create_consumer(self):
        original(self)
        _PREFETCHING.add(self._consumer)

    return _create_consumer


@fix("fairseq.options:parse_args_and_arch",
     launchers=("fairseq-train", "python -m fairseq_cli.train", *DECODING))
def help_lists_model_flags(original):
    """``fairseq-train --arch X --help`` (``fairseq-generate`` alike) prints its help before it adds
    the flags of X, its task and its criterion, so none of them show.

    ``parse_args_and_arch`` parses twice, and ``--help`` ends the first parse. With ``-h`` or
    ``--help`` it runs without them (words that are required, such as the data directory, may be
    missing; any other error, an unknown ``--arch`` for one, ends it as without ``--help``) and then
    prints the whole parser's help and exits with status 0."""

    @functools.wraps(original)
    def parse_args_and_arch(parser, input_args=None, *args, **kwargs):
        argv = sys.argv[1:] if input_args is None else list(input_args)
        if not {"-h", "--help"} & set(argv):
            return original(parser, input_args, *args, **kwargs)
        error = parser.error

        def unless_missing(message):  # a required word missing (the data directory) does not matter to the help
            if not message.startswith("the following arguments are required"):
                error(message)

        parser.error = unless_missing
        try:
            original(parser, [a for a in argv if a not in ("-h", "--help")], *args, **kwargs)
        except RuntimeError:  # no --arch given: fairseq's own help, as upstream
            pass
        finally:
            parser.error = error
        parser.print_help()
        sys.exit(0)

    return parse_args_and_arch


@fix("fairseq.tasks.fairseq_task:FairseqTask.build_model", "fairseq.tasks.fairseq_task:FairseqTask.build_criterion",
     "fairseq.tasks.fairseq_task:LegacyFairseqTask.build_model",
     "fairseq.tasks.fairseq_task:LegacyFairseqTask.build_criterion", launchers=("fairseq-hydra-train",))
def presets_reach_the_criterion(build_model, build_criterion, legacy_build_model, legacy_build_criterion):
    """Under ``fairseq-hydra-train`` a preset's settings of its criterion's fields (latent depth's
    training schedule) do not reach the criterion, which trains with its own defaults.

    ``fairseq-train`` reads model and criterion from one namespace; ``fairseq-hydra-train`` keeps
    ``criterion`` apart from ``model`` and applies the preset to ``model`` alone. For the tasks of both
    of fairseq's bases, ``build_model`` first adds to the model config the criterion's set fields it
    lacks, so the preset reads them; ``build_criterion`` then copies from the model config each field
    of the criterion's dataclass that the criterion's config leaves unset (None). A value given on
    the command line or in the YAML is kept."""
    return (*_one_namespace(build_model, build_criterion), *_one_namespace(legacy_build_model, legacy_build_criterion))


def _one_namespace(build_model, build_criterion):
    @functools.wraps(build_model)
    def model_built(self, cfg, *args, **kwargs):
        root = cfg._get_parent() if isinstance(cfg, DictConfig) else None  # OmegaConf: the whole config
        criterion = root.get("criterion") if isinstance(root, DictConfig) else None
        if isinstance(criterion, DictConfig):
            with open_dict(cfg):
                for field, value in criterion.items():
                    if field != "_name" and value is not None and field not in cfg:
                        cfg[field] = value
        self.model_cfg = cfg
        return build_model(self, cfg, *args, **kwargs)

    @functools.wraps(build_criterion)
    def criterion_built(self, cfg, *args, **kwargs):
        model, name = getattr(self, "model_cfg", None), getattr(cfg, "_name", None)
        if isinstance(cfg, DictConfig) and isinstance(model, DictConfig) and name in CRITERION_DATACLASS_REGISTRY:
            fields = [f.name for f in dataclasses.fields(CRITERION_DATACLASS_REGISTRY[name])]
            with open_dict(cfg):
                for field in fields:
                    if cfg.get(field) is None and model.get(field) is not None:
                        cfg[field] = model[field]
        return build_criterion(self, cfg, *args, **kwargs)

    return model_built, criterion_built
