"""Fixes for fairseq 0.12 that the plugin applies when it is imported (``--user-dir`` or
``import fairseq_widearch``), for every architecture, stock ones included. Each replaces a silent
wrong answer by the right one or by an error; nothing else of fairseq's behaviour changes.

* ``keep_last_batch``: upstream fairseq (``ve-fairseq`` 0.12.3) drops the last batch of every
  epoch, validation pass and decoding run when its size is not a multiple of
  ``--required-batch-size-multiple`` (upstream issues #5036, #5351).
* ``require_auxiliary_criterion``: a model whose objective has auxiliary losses (WideNet's
  balance loss, latent depth's KL and target depth) trained with a criterion that drops them. The
  same start-up hook tells the plugin's decoders when the criterion reads alignments in training
  (``label_smoothed_cross_entropy_with_alignment``; else they compute none there,
  ``fairseq_widearch.models.base.AlignmentsWhenRead``).
* ``resume_patience``: a resumed ``fairseq-train --patience N`` forgets how many validations
  had not improved, and takes its first validation after resuming as the best.
* ``finished_runs_stay_finished``: ``fairseq-train`` resumed from a checkpoint that already
  has ``--max-update`` updates trains one more update and saves it over ``checkpoint_last.pt``.
* ``amp_loss_scaler_flags``: ``--amp`` starts its loss scale at ``--fp16-init-scale`` instead
  of ``--amp-init-scale``, and ``--amp-scale-window W`` grows the scale every
  ``--amp-init-scale`` updates instead of every W.
* ``bf16_without_tpu``: ``fairseq-train --bf16`` turns on ``--tpu`` (upstream issue #4696), and
  without torch_xla fails at start, on a GPU as on a CPU.
* ``bf16_inference``: ``fairseq-generate --bf16`` (and ``fairseq-interactive``, the hub
  interface) decodes in fp32, ignoring the flag.
* ``torchrun_joins_one_group``: workers started by ``torchrun`` train as independent runs (or,
  without CUDA, fail) unless ``--distributed-world-size`` matches, which its default does only on
  a machine with as many GPUs as workers; a group that ``torchrun --max-restarts`` starts again
  hangs in its distributed init.
* ``bmuf_world_size``: under torchrun or SLURM, ``--use-bmuf`` reads a world size of 1 and never
  synchronises.
* ``pytorch_ddp_on_cpu``: ``--ddp-backend pytorch_ddp``, the default, fails on CPU workers.
* ``heartbeat_ends_a_hung_job``: ``--heartbeat-timeout`` logs that it kills a worker that makes no
  progress, but its SIGINT cannot end one that waits in a collective for a hung peer.
* ``checkpoint_copies_are_atomic``: a kill while fairseq copies a saved checkpoint to
  ``checkpoint_last.pt`` leaves that file cut short.
* ``help_lists_model_flags``: ``fairseq-train --arch X --help`` (``fairseq-generate`` alike)
  prints its help before it adds the flags of X, its task and its criterion, so none of them show.
* ``presets_reach_the_criterion``: under ``fairseq-hydra-train`` an architecture preset's settings
  of its criterion's fields (latent depth's training schedule) do not reach the criterion, which
  trains with its own defaults.
* ``prefetching_stops_at_exit``: ``fairseq-train`` stopped mid-epoch (``--max-update``,
  ``--max-valid-steps``) can abort at exit ("terminate called without an active exception",
  exit status 134 or -6) after it has finished and saved.
"""
import atexit
import dataclasses
import functools
import importlib.util
import logging
import math
import os
import queue
import shutil
import signal as signal_module
import sys
import time
import urllib.parse
import weakref
from typing import Optional

import numpy as np
import torch
from omegaconf import DictConfig, open_dict
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY
from fairseq.data import data_utils
from fairseq import options
from fairseq.distributed import utils as distributed_utils
from fairseq.models import BaseFairseqModel
from fairseq.optim.amp_optimizer import AMPOptimizer
from fairseq.tasks import FairseqTask, LegacyFairseqTask
from fairseq.trainer import Trainer


def keep_last_batch():
    """Make ``fairseq.data.data_utils.batch_by_size`` keep the remainder as a batch of its own.

    ``batch_by_size`` (used by every task's ``get_batch_iterator``: training, validation,
    fairseq-generate, fairseq-interactive, the hub interface) ends with
    ``if bsz_mult > 1 and len(b[-1]) % bsz_mult != 0: b = b[:-1]``. Batches are sorted by length,
    so the dropped sentences are always the longest: Multi30k ``val`` validates 1,008 of its 1,014
    sentences, and fairseq-generate's BLEU silently covers a subset. fairseq 0.12.2 kept them; so
    does this wrapper. Idempotent.
    """
    original = data_utils.batch_by_size
    if getattr(original, "keeps_last_batch", False):
        return

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

    batch_by_size.keeps_last_batch = True
    data_utils.batch_by_size = batch_by_size


def auxiliary_criterion_error(model, criterion) -> Optional[str]:
    """Why ``criterion`` cannot train ``model`` (it would drop the model's auxiliary losses), or
    None. A model names the criterion that adds its auxiliary losses in ``auxiliary_criterion``
    (a registered criterion name; subclasses of that criterion qualify too)."""
    model = getattr(model, "module", model)  # data-parallel wrappers
    needed = getattr(model, "auxiliary_criterion", None)
    if needed is None or isinstance(criterion, CRITERION_REGISTRY[needed]):
        return None
    name = next((key for key, cls in CRITERION_REGISTRY.items() if type(criterion) is cls), type(criterion).__name__)
    return (f"{model.auxiliary_losses} is part of the training objective, and --criterion {name} leaves it out: "
            f"train with --criterion {needed}")


def alignments_for_criterion(model, criterion):
    """The plugin's decoders compute no attention weights in training unless something reads them
    (``fairseq_widearch.models.base.AlignmentsWhenRead``): tell ``model``'s decoder to, when
    ``criterion`` is fairseq's alignment-supervised one (it reads ``extra["attn"]``)."""
    decoder = getattr(getattr(model, "module", model), "decoder", None)
    if decoder is not None and isinstance(criterion, CRITERION_REGISTRY["label_smoothed_cross_entropy_with_alignment"]):
        decoder.alignments_in_training = True


def require_auxiliary_criterion():
    """Stop fairseq-train at start-up (when its ``Trainer`` is built) if the criterion would drop
    the model's auxiliary losses, with a message naming the criterion to use; and let the model
    compute alignments in training where the criterion reads them (``alignments_for_criterion``).
    Idempotent."""
    original = Trainer.__init__
    if getattr(original, "checks_auxiliary_criterion", False):
        return

    @functools.wraps(original)
    def __init__(self, cfg, task, model, criterion, *args, **kwargs):
        error = auxiliary_criterion_error(model, criterion)
        if error:
            raise ValueError(error)
        alignments_for_criterion(model, criterion)
        original(self, cfg, task, model, criterion, *args, **kwargs)

    __init__.checks_auxiliary_criterion = True
    Trainer.__init__ = __init__


def _should_stop_early():
    """fairseq-train's early-stopping function, which keeps its state on itself."""
    from fairseq_cli import train

    return train.should_stop_early


def resume_patience():
    """Keep ``--patience`` across a resumed fairseq-train.

    ``fairseq_cli.train.should_stop_early`` holds the best validation loss and the number of
    validations since it on the function object, which a new process starts afresh: an interrupted
    run that resumes from ``checkpoint_last.pt`` trains up to ``--patience`` validations longer
    than the same run uninterrupted, and the epochs or checkpoints it ends with differ. This stores
    both in the checkpoint's extra state (key ``should_stop_early``) and restores them on load,
    under fairseq's own condition for restoring the best checkpoint's loss (neither
    ``--reset-optimizer`` nor ``--reset-meters``, so ``--finetune-from-model`` starts afresh).
    Idempotent.
    """
    save, load = Trainer.save_checkpoint, Trainer.load_checkpoint
    if getattr(save, "keeps_patience", False):
        return

    @functools.wraps(save)
    def save_checkpoint(self, filename, extra_state):
        stop = _should_stop_early()
        if hasattr(stop, "best"):
            extra_state = {**extra_state, "should_stop_early": {"best": stop.best, "num_runs": stop.num_runs}}
        save(self, filename, extra_state)

    @functools.wraps(load)
    def load_checkpoint(self, filename, reset_optimizer=False, reset_lr_scheduler=False, optimizer_overrides=None,
                        reset_meters=False):
        extra_state = load(self, filename, reset_optimizer, reset_lr_scheduler, optimizer_overrides, reset_meters)
        state = (extra_state or {}).get("should_stop_early")
        if state is not None and not reset_optimizer and not reset_meters:
            stop = _should_stop_early()
            stop.best, stop.num_runs = state["best"], state["num_runs"]
        return extra_state

    save_checkpoint.keeps_patience = True
    Trainer.save_checkpoint, Trainer.load_checkpoint = save_checkpoint, load_checkpoint


def finished_runs_stay_finished():
    """Train nothing when the run resumed from its checkpoint has ``--max-update`` updates already.

    ``fairseq_cli.train.main`` checks ``--max-update`` only after an update (in
    ``validate_and_save``), so running the same ``fairseq-train`` command again after it finished,
    as a resumable recipe does, trains update N + 1 and saves it as ``checkpoint_last.pt`` (and a
    ``checkpoint_E_N+1.pt`` under ``--save-interval-updates``): every rerun moves the model on by
    one update. This wraps the per-epoch ``train`` that ``main`` calls, returning fairseq's own
    "stop" before the first update. ``--max-update 0`` (no limit) is unaffected. Idempotent.
    """
    from fairseq_cli import train as train_cli

    original = train_cli.train
    if getattr(original, "stops_finished_runs", False):
        return

    @functools.wraps(original)
    def train(cfg, trainer, task, epoch_itr):
        max_update = cfg.optimization.max_update or math.inf
        if trainer.get_num_updates() >= max_update:
            logging.getLogger("fairseq_cli.train").info(
                f"nothing to train: the checkpoint has {trainer.get_num_updates()} updates, --max-update {max_update}")
            return [None], True
        return original(cfg, trainer, task, epoch_itr)

    train.stops_finished_runs = True
    train_cli.train = train


def amp_loss_scaler_flags():
    """Build ``--amp``'s loss scaler from the AMP flags.

    fairseq's ``AMPOptimizer`` gives ``torch.cuda.amp.GradScaler`` ``--fp16-init-scale`` as its
    initial scale, and, when ``--amp-scale-window W`` is set, ``--amp-init-scale`` as its growth
    interval: ``--amp-init-scale`` is never the initial scale, and the window is never W (128
    updates with the defaults, whatever W). This rebuilds the scaler with ``--amp-init-scale`` and,
    when set, ``--amp-scale-window`` (else torch's default interval, 2,000, as before). Both flags
    at their defaults give the scaler fairseq built. Idempotent.
    """
    init = AMPOptimizer.__init__
    if getattr(init, "uses_amp_flags", False):
        return

    @functools.wraps(init)
    def __init__(self, cfg, params, fp32_optimizer, **kwargs):
        init(self, cfg, params, fp32_optimizer, **kwargs)
        window = getattr(cfg.common, "amp_scale_window", None)
        self._grad_scaler = torch.cuda.amp.GradScaler(init_scale=cfg.common.amp_init_scale,
                                                      **({"growth_interval": window} if window is not None else {}))

    __init__.uses_amp_flags = True
    AMPOptimizer.__init__ = __init__


def bf16_without_tpu():
    """Let ``--bf16`` / ``--memory-efficient-bf16`` train where there is no TPU.

    fairseq's ``options.parse_args_and_arch`` sets ``args.tpu = True`` whenever ``--bf16`` is given
    (upstream issue #4696), so ``fairseq-train --bf16`` on a GPU or a CPU dies in
    ``utils.get_tpu_device`` ("'NoneType' object has no attribute 'xla_device'"). Apart from that
    line, fairseq's trainer has a whole bf16 path: the model and criterion cast to bf16, batches'
    floats cast, ``FP16Optimizer`` (or ``MemoryEfficientFP16Optimizer``) keeping fp32 master weights,
    and no loss scaler. The plugin is imported inside that parse, after the line's function started,
    so the fix sits at the next step, ``distributed_utils.call_main``: there ``--tpu`` goes back
    to False when ``--bf16`` is on, ``--tpu`` was not on the command line and torch_xla is not
    installed (where it is, ``--bf16`` keeps meaning a TPU, as upstream). Idempotent.
    """
    original = distributed_utils.call_main
    if getattr(original, "bf16_without_tpu", False):
        return

    @functools.wraps(original)
    def call_main(cfg, main, **kwargs):
        implied = cfg.common.bf16 and cfg.common.tpu and "--tpu" not in sys.argv
        if implied and importlib.util.find_spec("torch_xla") is None:
            cfg.common.tpu = cfg.distributed_training.tpu = False  # the latter a copy, not a reference
        return original(cfg, main, **kwargs)

    call_main.bf16_without_tpu = True
    distributed_utils.call_main = call_main


def bf16_inference():
    """Cast a model to bf16 for inference under ``--bf16``.

    ``fairseq-generate`` and ``fairseq-interactive`` cast the model to fp16 under ``--fp16`` and do
    nothing under ``--bf16``, so the flag is accepted and the model decodes in fp32. Every inference
    entry point (those two, the hub interface) calls ``model.prepare_for_inference_(cfg)`` once the
    model is on its device: this wrapper casts there. Log-probabilities stay fp32 (fairseq's
    ``log_softmax`` runs in fp32), as with ``--fp16``. Idempotent.
    """
    original = BaseFairseqModel.prepare_for_inference_
    if getattr(original, "casts_bf16", False):
        return

    @functools.wraps(original)
    def prepare_for_inference_(self, cfg):
        if getattr(getattr(cfg, "common", None), "bf16", False):
            self.to(dtype=torch.bfloat16)
        return original(self, cfg)

    prepare_for_inference_.casts_bf16 = True
    BaseFairseqModel.prepare_for_inference_ = prepare_for_inference_


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


def torchrun_joins_one_group():
    """Join the workers torchrun starts into one process group, on CPUs as on GPUs, in every
    attempt of a job that torchrun restarts.

    fairseq reads torchrun's variables only when ``--distributed-world-size`` is above 1, and its
    default is the number of local GPUs (at least 1): on a CPU, on a machine with one GPU, or on
    several machines with one GPU each, every worker trains alone, without an error, and all write
    the same checkpoint files. Given ``--distributed-world-size`` on a machine without CUDA, it
    fails in ``rank % torch.cuda.device_count()``. Under torchrun's variables this wrapper sets the
    world size and rank from ``WORLD_SIZE`` and ``RANK``, the processes on this machine from
    ``LOCAL_WORLD_SIZE``, the device from ``LOCAL_RANK`` (modulo its GPUs), ``env://`` as the init
    method, and ``--distributed-no-spawn`` (torchrun has started the processes).

    torchrun shares its rendezvous store with the workers (static and c10d rendezvous alike), and
    keeps it over restarts, without a prefix per attempt (torch 2.13; PyTorch's upstream issue
    #135712): the group a ``--max-restarts`` restart starts reads the keys the lost group wrote and
    hangs in its distributed init, or fails in gloo's ``connectFullMesh``. There the init method is
    ``ATTEMPT_INIT_METHOD``, whose keys carry the attempt (``TORCHELASTIC_RESTART_COUNT``): the
    same for all workers of one machine. Agents of several machines count their restarts apart, so
    that a restart would wait for the process group's timeout (30 minutes): such a job stops at
    its start instead, naming the form that restarts (the c10d rendezvous with
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, a store per attempt). Idempotent.

    Raises:
        ValueError: when ``--distributed-world-size`` differs from ``WORLD_SIZE`` and from its
            default (a value equal to the default cannot be told from the default, and yields);
            when torchrun may restart the workers of several machines sharing its store.
    """
    original = distributed_utils.infer_init_method
    if getattr(original, "reads_torchrun", False):
        return
    torch.distributed.register_rendezvous_handler(ATTEMPT_INIT_METHOD.split(":")[0], _attempt_rendezvous)

    @functools.wraps(original)
    def infer_init_method(cfg, force_distributed=False):
        torchrun = all(v in os.environ for v in TORCHRUN_VARIABLES)
        if (not torchrun or cfg.distributed_init_method is not None or cfg.tpu or cfg.pipeline_model_parallel
                or int(os.environ["WORLD_SIZE"]) == 1):  # fairseq's own path (pipelines: its device setup)
            return original(cfg, force_distributed)
        world = int(os.environ["WORLD_SIZE"])
        if cfg.distributed_world_size not in (world, max(1, torch.cuda.device_count())):
            raise ValueError(f"--distributed-world-size {cfg.distributed_world_size} under torchrun's "
                             f"WORLD_SIZE={world}: leave the flag out (the workers torchrun starts are the group)")
        shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        if (shared and int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1
                and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0):
            raise ValueError("torchrun --max-restarts on several machines sharing its rendezvous store: a restart "
                             "would hang; run TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --rdzv-backend c10d ...")
        cfg.distributed_init_method = ATTEMPT_INIT_METHOD if shared else "env://"
        cfg.distributed_world_size, cfg.distributed_rank = world, int(os.environ["RANK"])
        cfg.distributed_num_procs = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        # LOCAL_RANK among the GPUs this worker sees (one, where a launcher gives each its own)
        local, gpus = int(os.environ["LOCAL_RANK"]), torch.cuda.device_count()
        cfg.device_id = local % gpus if gpus else local
        cfg.distributed_no_spawn = True

    infer_init_method.reads_torchrun = True
    distributed_utils.infer_init_method = infer_init_method


_fairseq_distributed_main = distributed_utils.distributed_main


def _distributed_main(i, main, cfg, kwargs):
    """fairseq's ``distributed_main`` after the BMUF config's world size is set (bmuf_world_size).
    A function of this module, so that fairseq's spawned workers, which unpickle it by name, import
    the plugin and run it too."""
    if "bmuf" in cfg:
        cfg.bmuf.distributed_world_size = cfg.distributed_training.distributed_world_size
    return _fairseq_distributed_main(i, main, cfg, kwargs)


def bmuf_world_size():
    """Give ``--use-bmuf`` the world size the job runs with.

    fairseq copies ``--distributed-world-size`` into the BMUF config when it parses the command
    line, before the world size is found from torchrun's or SLURM's variables: under either, BMUF
    read the default (1 on a CPU or one GPU), skipped its synchronisations without an error, and
    the logged config said so. The copy is made again once the world size is known
    (``distributed_utils.distributed_main``, before ``main``). Idempotent.
    """
    distributed_utils.distributed_main = _distributed_main


def pytorch_ddp_on_cpu():
    """Let ``--ddp-backend pytorch_ddp`` (fairseq's default) wrap a model on the CPU.

    fairseq builds PyTorch's ``DistributedDataParallel`` with ``device_ids=[--device-id]``, which
    PyTorch refuses for a module on the CPU ("device_ids ... only work with single-device/multiple-device
    GPU modules"): ``fairseq-train --cpu`` with data parallelism failed unless given
    ``--ddp-backend legacy_ddp``. For a module whose parameters are all on the CPU the wrapper is
    built with ``device_ids=None`` (PyTorch's form for CPU modules); everything else as fairseq
    passes it. Idempotent.
    """
    from fairseq.models import distributed_fairseq_model

    original = distributed_fairseq_model.DistributedDataParallel
    if getattr(original, "cpu_modules", False):
        return

    class DistributedDataParallel(original):
        cpu_modules = True

        def __init__(self, module, device_ids=None, output_device=None, **kwargs):
            if all(p.device.type == "cpu" for p in module.parameters()):
                device_ids = output_device = None
            super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)

    distributed_fairseq_model.DistributedDataParallel = DistributedDataParallel


def heartbeat_ends_a_hung_job():
    """Make ``--heartbeat-timeout N`` end a worker that has made no progress for N seconds.

    fairseq's watchdog (``DistributedTimeoutWrapper``) logs "Killing job for not making progress"
    and sends the worker SIGINT. A worker waiting in a collective for a peer that hangs is inside
    the communication library, where Python never gets to raise the KeyboardInterrupt: the job went
    on waiting for the process group's timeout (30 minutes on gloo). SIGTERM, whose default action
    ends the process wherever it waits, is sent instead; torchrun then stops the group (and starts
    it again under ``--max-restarts``). A signal the caller names is kept. Idempotent.
    """
    from fairseq.distributed.distributed_timeout_wrapper import DistributedTimeoutWrapper

    original = DistributedTimeoutWrapper.__init__
    if getattr(original, "ends_hung_jobs", False):
        return

    @functools.wraps(original)
    def __init__(self, module, timeout, signal=signal_module.SIGTERM):
        original(self, module, timeout, signal)

    __init__.ends_hung_jobs = True
    DistributedTimeoutWrapper.__init__ = __init__


def checkpoint_copies_are_atomic():
    """Write the copies of a saved checkpoint (``checkpoint_last.pt``, ``checkpoint_best.pt``) to a
    temporary file renamed over the target, as fairseq writes the checkpoint itself.

    ``checkpoint_utils.save_checkpoint`` saves the first checkpoint of an update or epoch
    atomically (``torch_persistent_save``: ``.tmp``, then a rename) and copies it to the others with
    ``shutil.copyfile``, which truncates the target and writes it in place: a worker killed during
    the copy (a preempted job, torchrun stopping the group) leaves ``checkpoint_last.pt`` cut short,
    and the restart cannot resume. Now a kill leaves the previous ``checkpoint_last.pt`` whole. Only
    local paths change; fairseq's ``PathManager`` handles the others as before. Idempotent.
    """
    from fairseq.file_io import PathManager

    original = PathManager.copy
    if getattr(original, "atomic", False):
        return

    @functools.wraps(original)
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if not PathManager.supports_rename(dst_path):
            return original(src_path, dst_path, overwrite)
        shutil.copyfile(src_path, dst_path + ".tmp")
        os.replace(dst_path + ".tmp", dst_path)
        return True

    copy.atomic = True
    PathManager.copy = staticmethod(copy)


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


def prefetching_stops_at_exit():
    """Stop the threads of fairseq's ``BufferedIterator`` (``--data-buffer-size``) before Python
    finalises, in an ``atexit`` handler.

    Each iterator prefetches batches in a daemon thread that collates them with torch operators. A
    run that ends before its iterator is exhausted (``--max-update`` mid-epoch, ``--max-valid-steps``)
    leaves that thread running; where it is inside a torch operator when the interpreter finalises
    (CPython < 3.14 ends daemon threads with ``pthread_exit``, which unwinds through torch's C++
    frames), the process aborts with "terminate called without an active exception" after training
    has finished and saved its checkpoints, and scripts that check the exit status fail. The handler
    lets each live thread finish the batch it is on and return, for at most
    ``PREFETCH_STOP_SECONDS`` seconds in all. Idempotent.
    """
    from fairseq.data.iterators import BufferedIterator

    original = BufferedIterator._create_consumer
    if getattr(original, "stops_at_exit", False):
        return

    @functools.wraps(original)
    def _create_consumer(self):
        original(self)
        _PREFETCHING.add(self._consumer)

    _create_consumer.stops_at_exit = True
    BufferedIterator._create_consumer = _create_consumer
    atexit.register(_stop_prefetching)


def help_lists_model_flags():
    """Print ``--help`` after the architecture's, task's and criterion's flags are added.

    fairseq's ``options.parse_args_and_arch`` parses twice: the first parse reads ``--arch``,
    ``--task`` and ``--criterion``, then their flags are added for the second. ``--help`` ends the
    first parse, so the flags a user asks about are never listed. The plugin is imported when
    ``fairseq-train`` builds its parser, before that call, so the call is wrapped: with ``-h`` or
    ``--help`` it runs without them (words that are required, such as the data directory, may be
    missing; any other error, an unknown ``--arch`` for one, ends it as without ``--help``) and then
    prints the whole parser's help and exits with status 0. Idempotent.
    """
    original = options.parse_args_and_arch
    if getattr(original, "help_lists_model_flags", False):
        return

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

    parse_args_and_arch.help_lists_model_flags = True
    options.parse_args_and_arch = parse_args_and_arch


def presets_reach_the_criterion():
    """Under ``fairseq-hydra-train``, let the preset read the criterion's settings and give the
    criterion the preset's value of each of its fields that its config leaves unset.

    ``fairseq-train`` reads the model's and the criterion's settings from one namespace, in which an
    architecture preset (``register_model_architecture``) reads criterion flags (latent depth's
    ``--latent-objective``) and sets the criterion's fields it owns (its training schedule).
    ``fairseq-hydra-train`` keeps ``criterion`` apart from ``model`` and applies the preset to
    ``model`` alone, so the preset would read no criterion flag and the criterion would train with
    its own defaults. Wrapped, for the tasks of both of fairseq's bases: ``build_model`` first adds
    to the model config the criterion's set fields it lacks (from the config both belong to), so
    the preset reads them; ``build_criterion`` then copies from the model config each field of the
    criterion's dataclass that the criterion's config leaves unset (None), as the preset's
    ``set_unset`` does under ``fairseq-train``, where the namespace is one and nothing is copied. A
    value given on the command line or in the YAML is kept. Idempotent.
    """
    for task in (FairseqTask, LegacyFairseqTask):
        if not getattr(task.build_criterion, "presets_reach_the_criterion", False):
            task.build_model, task.build_criterion = _one_namespace(task.build_model, task.build_criterion)


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

    criterion_built.presets_reach_the_criterion = True
    return model_built, criterion_built
