"""What the plugin fixes in fairseq on import (fairseq_widearch/fairseq_fixes.py): the registry (each fix
declared once, the off switch, each pinned to the fairseq it was written for), the fixes' own units,
and the matrix's rows of the launchers that run in this process: each fix's guard (tests/fix_guards.py)
under fairseq-train, ``python -m fairseq_cli.train``, fairseq-hydra-train and the decoders, where the
registry says it is tested (torchrun's and fairseq's spawn's rows: tests/test_fairseq_fixes_launched.py)."""
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from fairseq.data import data_utils

from fairseq_widearch import fairseq_fixes
from fairseq_widearch.fairseq_fixes import DECODING, FIXES, TRAINING, auxiliary_criterion_error
from fairseq_widearch.model_builder import build_model
from fix_guards import ELSEWHERE, GUARDS, MATRIX, PLUGIN, PROCESSES, SENTENCES, dummy_runs
from testing_utils import REPO, TINY_CASES, fairseq


@pytest.fixture(scope="module")
def launcher_runs(tmp_path_factory):
    return dummy_runs(tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("name,launcher", [row for row in MATRIX if row[1] not in PROCESSES])
def test_each_fix_holds_under_each_launcher_in_this_process(name, launcher, launcher_runs, monkeypatch):
    GUARDS[name](launcher_runs(launcher), monkeypatch)


def test_every_fix_has_a_guard_and_rows_under_fairseqs_launchers():
    assert sorted({name for name, _ in MATRIX} - set(GUARDS)) == [] and sorted(set(GUARDS) - set(FIXES)) == []
    assert {launcher for fix_ in FIXES.values() for launcher in fix_.launchers} <= {*TRAINING, *DECODING}
    assert {fix_name for fix_name, _ in ELSEWHERE} <= set(FIXES)
    assert {launcher for _, launcher in MATRIX} == {*TRAINING, *DECODING}  # every launcher has its rows


# ---- the registry ----

def test_each_fix_replaces_what_it_declares_and_once():
    for name, fix_ in FIXES.items():
        for target in fix_.replaces:
            for owner, attribute in fairseq_fixes.owners(target):
                assert name in fairseq_fixes.fixes_on(getattr(owner, attribute)), (name, target)
    before = {target: fairseq_fixes.owners(target)[0] for fix_ in FIXES.values() for target in fix_.replaces}
    values = {target: getattr(*place) for target, place in before.items()}
    fairseq_fixes.apply_fixes()  # again: nothing changes
    assert all(getattr(*before[target]) is values[target] for target in before)


def test_every_pin_is_the_installed_fairseqs():
    assert {target: fairseq_fixes.fingerprint(getattr(*fairseq_fixes.owners(target)[0]))
            for fix_ in FIXES.values() for target in fix_.pins} == \
        {target: fairseq_fixes.WRITTEN_FOR[target] for fix_ in FIXES.values() for target in fix_.pins}


def test_a_changed_target_is_left_alone_with_one_warning(monkeypatch):
    def batch_by_size(indices, *args, **kwargs):  # another fairseq's: a different source
        return [indices]

    monkeypatch.setattr(data_utils, "batch_by_size", batch_by_size)
    monkeypatch.setattr(fairseq_fixes, "_WARNED", set())
    with pytest.warns(fairseq_fixes.FixNotApplied, match=r"fix keep_last_batch not applied: "
                      r"fairseq.data.data_utils:batch_by_size: its source \(sha256 \w+\) differs") as warned:
        fairseq_fixes.apply_fixes()
        fairseq_fixes.apply_fixes()
    assert data_utils.batch_by_size is batch_by_size and len(warned) == 1


@pytest.mark.e2e
def test_the_off_switch_takes_none_all_or_fixes_to_leave_out_and_refuses_an_unknown_name_in_one_line():
    code = ("import fairseq_widearch; from fairseq.data import data_utils; from fairseq_widearch import fairseq_fixes as f; "
            "print(sorted(f.fixes_on(data_utils.batch_by_size)), f.fixes_on(f.owners('fairseq_cli.train:train')[0][0].train))")
    for setting, expected in [("none", "[] set()"), ("keep_last_batch", "[] {'finished_runs_stay_finished'}"),
                              ("all", "['keep_last_batch'] {'finished_runs_stay_finished'}")]:
        proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FAIRSEQ_WIDEARCH_FIXES": setting},
                              capture_output=True, text=True, timeout=120)
        assert proc.stdout.strip() == expected, (setting, proc.stderr[-2000:])
    proc = subprocess.run([sys.executable, "-c", "import fairseq_widearch"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FAIRSEQ_WIDEARCH_FIXES": "keep_last_batch,no_such_fix"})
    message = proc.stderr.strip().splitlines()[-1]  # (after fairseq's own note on tensorboardX)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "no fix named no_such_fix" in message
    assert message.startswith("FAIRSEQ_WIDEARCH_FIXES=") and all(name in message for name in FIXES)


NO_FIXES_FLOW = """
from pathlib import Path
from fairseq_widearch import fairseq_fixes
from testing_utils import TINY_CASES, fairseq, dummy_translation_data, train
assert fairseq_fixes._SELECTED == [], fairseq_fixes._SELECTED
tmp = Path({tmp!r})
data = dummy_translation_data(tmp)
for arch, flags in TINY_CASES.items():
    train(data, tmp / arch, arch, *flags, max_update=3)
    out = fairseq("generate", data, "--user-dir", {plugin!r}, "--path", tmp / arch / "checkpoint_last.pt",
                  "--gen-subset", "test", "--batch-size", "8", "--required-batch-size-multiple", "1", "--beam", "1",
                  "--max-len-b", "3", "--cpu", *flags[:2])
    print(arch, out.stdout.count("H-"))
"""


@pytest.mark.slow
@pytest.mark.e2e
def test_with_every_fix_off_each_architecture_trains_and_decodes_through_stock_fairseq(tmp_path):
    """As stock fairseq under torch >= 2.6 decodes at all: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, and
    --required-batch-size-multiple 1 for every sentence."""
    code = NO_FIXES_FLOW.format(tmp=str(tmp_path), plugin=str(PLUGIN))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO / "tests",
                          env={**os.environ, "FAIRSEQ_WIDEARCH_FIXES": "none", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
                               "PYTHONPATH": str(REPO / "tests")})
    decoded = dict(line.split() for line in proc.stdout.splitlines() if line.count(" ") == 1)
    assert decoded == {arch: str(SENTENCES) for arch in TINY_CASES}, proc.stderr[-3000:]


# ---- the fixes' own units ----

@pytest.mark.parametrize("size,max_sentences", [(461, 16), (1014, 64), (3003, 128), (7, None)])
def test_batch_by_size_keeps_the_remainder_as_its_own_batch(size, max_sentences):
    lengths = np.random.default_rng(0).integers(3, 60, size)
    indices = np.argsort(lengths, kind="mergesort")
    batches = data_utils.batch_by_size(indices, lengths.__getitem__, num_tokens_vec=lengths[indices],
                                       max_tokens=4096, max_sentences=max_sentences, required_batch_size_multiple=8)
    assert np.array_equal(np.concatenate(batches), indices)  # every sentence once, in order
    assert all(len(b) % 8 == 0 for b in batches[:-1])


def test_models_without_auxiliary_losses_train_with_any_criterion():
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
    criterion = LabelSmoothedCrossEntropyCriterion(SimpleNamespace(target_dictionary=None), False, 0.1)
    for arch, argv in [("widenet_tiny", ["--widenet-dense-ffn"]), ("multipath_transformer_tiny", []),
                       ("partialformer_tiny", [])]:
        assert auxiliary_criterion_error(build_model(arch, argv, vocab_size=40), criterion) is None
    assert "moe_label_smoothed_cross_entropy" in auxiliary_criterion_error(build_model("widenet_tiny", vocab_size=40),
                                                                           criterion)


#: A process that takes one batch of a BufferedIterator whose source is still collating (torch
#: operators) when the process ends, as fairseq-train's is when --max-update stops it mid-epoch.
STOPPED_MID_EPOCH = """
import sys, torch
import fairseq_widearch
from fairseq.data.iterators import BufferedIterator

class Collating:
    def __len__(self):
        return 10_000

    def __iter__(self):
        x = torch.randn(400, 400)
        while True:
            yield (x @ x).sum()

next(BufferedIterator(2, Collating()))
"""


@pytest.mark.e2e
def test_a_run_stopped_mid_epoch_exits_cleanly_while_its_prefetching_thread_collates():
    # the abort comes at the interpreter's exit
    proc = subprocess.run([sys.executable, "-c", STOPPED_MID_EPOCH], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "terminate called" not in proc.stderr, (proc.returncode, proc.stderr[-2000:])


def test_help_with_an_unknown_architecture_names_it_as_without_help():
    with pytest.raises(AssertionError, match="exited 2") as failed:
        fairseq("train", "--user-dir", PLUGIN, "--arch", "widenet_tinyy", "--help")
    assert "invalid choice: 'widenet_tinyy'" in str(failed.value)
