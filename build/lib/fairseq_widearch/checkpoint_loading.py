"""Loading and writing fairseq checkpoints: the classes a fairseq checkpoint holds (which the fix
``fairseq_fixes.allow_fairseq_checkpoint_globals`` adds to torch's weights-only allow-list, instead
of turning the protection off), the error naming an unreadable checkpoint, the plugin's config
upgrades of its older checkpoints, and checkpoints derived from a loaded one.
"""
import argparse
import collections
import functools
import typing

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


class CheckpointReadError(RuntimeError):
    """A checkpoint file that cannot be read (truncated, corrupted, not a checkpoint)."""


#: Functions of a loaded checkpoint's model config (a Namespace, DictConfig or dict) that rebuild
#: a model as it was trained when a default changed after it was saved (models register theirs).
CONFIG_UPGRADES = []


def upgrade_loaded_configs():
    """Make fairseq's ``checkpoint_utils.load_checkpoint_to_cpu`` (resume, generate, interactive, the
    hub interface) apply ``CONFIG_UPGRADES`` to the model config it reads: the plugin's own
    checkpoints saved before a default changed are rebuilt as they were trained. Not one of the
    fairseq fixes (``fairseq_fixes``): it serves the plugin's checkpoints, whatever fixes are on.
    Idempotent."""
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(load, "upgrades_configs", False):
        return

    @functools.wraps(load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        state = load(path, *args, **kwargs)
        model_cfg = (state.get("cfg") or {}).get("model") if isinstance(state, dict) else None
        for upgrade in CONFIG_UPGRADES:
            if model_cfg is not None:
                upgrade(model_cfg)
        return state

    load_checkpoint_to_cpu.upgrades_configs = True
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


def average_checkpoints(paths) -> dict:
    """The checkpoint whose parameters are the mean of those of ``paths`` (oldest first): floating-point
    tensors averaged in float64 and cast back, others and the config taken from the newest, no
    optimizer state (fairseq's ``scripts/average_checkpoints.py``, under weights-only loading).

    Raises:
        ValueError: if the checkpoints do not hold the same parameters.
    """
    states = [torch.load(p, map_location="cpu") for p in paths]
    names = list(states[-1]["model"])
    for path, state in zip(paths, states):
        if list(state["model"]) != names:
            raise ValueError(f"{path} does not hold the same parameters as {paths[-1]}")
    averaged = {}
    for name in names:
        newest = states[-1]["model"][name]
        if newest.is_floating_point():
            total = sum(s["model"][name].double() for s in states)
            averaged[name] = (total / len(states)).to(newest.dtype)
        else:
            averaged[name] = newest
    return {**states[-1], "model": averaged, "last_optimizer_state": None}
