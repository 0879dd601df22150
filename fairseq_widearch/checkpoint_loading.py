"""Safe loading of fairseq checkpoints under torch >= 2.6.

torch >= 2.6 loads with ``weights_only=True`` by default, and fairseq's
``checkpoint_utils.load_checkpoint_to_cpu`` calls plain ``torch.load``: every fairseq
checkpoint holds an ``argparse.Namespace`` (``args`` or ``cfg.model``) and older ones hold
omegaconf containers, so stock fairseq refuses its own checkpoints. Instead of turning the
protection off (``weights_only=False`` or ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``), we add to
torch's allow-list exactly the classes a fairseq checkpoint holds. Any other pickled global is
still refused with torch's ``UnpicklingError``.
"""
import argparse
import collections
import functools
import pickle
import typing
import zipfile

import torch
from fairseq.distributed.utils import _TensorPlaceholder
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode, BooleanNode, FloatNode, IntegerNode, StringNode

#: What fairseq (0.10-0.12) checkpoints hold besides tensors and plain containers:
#: the legacy ``args`` Namespace; omegaconf configs with their node/metadata classes; and the
#: types omegaconf records as metadata (``typing.Any`` and builtin element/key types); and the
#: placeholder that stands for a tensor when rank 0 broadcasts a loaded checkpoint's state to the
#: other data-parallel workers (``fairseq.distributed.utils.broadcast_object``, which the workers
#: ``torch.load``: without it every resumed multi-worker training fails at its first load).
FAIRSEQ_CHECKPOINT_GLOBALS = [
    _TensorPlaceholder,
    argparse.Namespace,
    collections.defaultdict,
    DictConfig,
    ListConfig,
    ContainerMetadata,
    Metadata,
    AnyNode,
    BooleanNode,
    FloatNode,
    IntegerNode,
    StringNode,
    typing.Any,
    bool,
    dict,
    float,
    int,
    list,
    str,
]


def allow_fairseq_checkpoint_globals():
    """Add ``FAIRSEQ_CHECKPOINT_GLOBALS`` to torch's weights-only allow-list.

    Idempotent; called when ``fairseq_widearch`` is imported. A no-op on torch < 2.4,
    which has no allow-list (and loads without ``weights_only`` by default).
    """
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add(FAIRSEQ_CHECKPOINT_GLOBALS)


class CheckpointReadError(RuntimeError):
    """A checkpoint file that cannot be read (truncated, corrupted, not a checkpoint)."""


#: Functions of a loaded checkpoint's model config (a Namespace, DictConfig or dict) that rebuild
#: a model as it was trained when a default changed after it was saved (models register theirs).
CONFIG_UPGRADES = []


def name_unreadable_checkpoints():
    """Make fairseq's ``checkpoint_utils.load_checkpoint_to_cpu`` (used by resume, generate,
    interactive and the hub interface) raise ``CheckpointReadError`` naming the file when it
    cannot be read, instead of torch's zip or pickle error, and apply ``CONFIG_UPGRADES`` to
    what it reads. A class refused by weights-only
    loading keeps torch's own error, which names the class. Idempotent."""
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(load, "names_unreadable_checkpoints", False):
        return

    @functools.wraps(load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            state = load(path, *args, **kwargs)
        except FileNotFoundError:
            raise
        except (RuntimeError, OSError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
            if "GLOBAL" in str(error):  # a class refused by weights-only loading: torch names it
                raise
            reason = str(error).strip().splitlines()[0] if str(error).strip() else "unexpected end of file"
            raise CheckpointReadError(f"cannot read checkpoint {path} (truncated or corrupted?): {reason}") from None
        model_cfg = (state.get("cfg") or {}).get("model") if isinstance(state, dict) else None
        for upgrade in CONFIG_UPGRADES:
            if model_cfg is not None:
                upgrade(model_cfg)
        return state

    load_checkpoint_to_cpu.names_unreadable_checkpoints = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


def plain_config(value):
    """A config as plain containers (no Namespace, no omegaconf objects)."""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, dict):
        return {k: plain_config(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_config(v) for v in value]
    return value


def save_derived_checkpoint(source_state: dict, model_args: argparse.Namespace, model_state: dict, out: str):
    """Write a checkpoint derived from the loaded checkpoint ``source_state`` (pruned, exported):
    its config with ``model_args`` stored as plain containers, so that fairseq loads it under
    weights-only loading, and ``model_state``; no optimizer or data-iterator state."""
    torch.save({"args": None, "cfg": plain_config({**source_state["cfg"], "model": model_args}), "model": model_state,
                "optimizer_history": plain_config(source_state["optimizer_history"]), "extra_state": {},
                "last_optimizer_state": None}, out)
