"""Build any registered fairseq architecture outside ``fairseq-train`` (stats tool, tests,
benchmarks), parsing the arch's own command-line flags exactly as fairseq does."""
import argparse
from types import SimpleNamespace
from typing import Optional, Sequence

from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY


def dummy_dictionary(vocab_size: int) -> Dictionary:
    """A fairseq ``Dictionary`` of exactly ``vocab_size`` entries (4 specials + symbols)."""
    d = Dictionary()
    for i in range(vocab_size - len(d)):
        d.add_symbol(f"w{i}")
    return d


def parse_arch_args(arch: str, argv: Sequence[str] = (), known_only: bool = False) -> argparse.Namespace:
    """Parse ``argv`` against ``arch``'s flags and apply the arch preset. ``known_only``: leave the
    flags that are not the arch's (a system's training flags: task, criterion) to their owners.

    Raises:
        ValueError: if ``arch`` is not registered (message lists nothing else to keep it short).
        SystemExit: from argparse on an unknown flag (unless ``known_only``).
    """
    if arch not in ARCH_MODEL_REGISTRY:
        raise ValueError(f"--arch {arch!r} is not a registered architecture")
    # fairseq adds model flags with SUPPRESS defaults so that presets fill what is not given.
    parser = argparse.ArgumentParser(prog=f"--arch {arch}", allow_abbrev=False, argument_default=argparse.SUPPRESS)
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    args = parser.parse_known_args(list(argv))[0] if known_only else parser.parse_args(list(argv))
    args.arch = arch
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def build_model(arch: str, argv: Sequence[str] = (), vocab_size: int = 1000,
                src_dict: Optional[Dictionary] = None, tgt_dict: Optional[Dictionary] = None,
                known_only: bool = False, **overrides):
    """Build ``arch`` with flags ``argv`` on a joined dictionary of ``vocab_size`` types (or the
    given dictionaries). ``overrides`` set args that no flag can (e.g. a store-true flag to False);
    ``known_only`` as in ``parse_arch_args``. Returns the fairseq model (train mode, fp32)."""
    args = parse_arch_args(arch, argv, known_only)
    vars(args).update(overrides)
    src_dict = src_dict or dummy_dictionary(vocab_size)
    # targets padded on the right, as fairseq's translation tasks pad them by default
    task = SimpleNamespace(source_dictionary=src_dict, target_dictionary=tgt_dict or src_dict,
                           cfg=SimpleNamespace(left_pad_target=False))
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task)
