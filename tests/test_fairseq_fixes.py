"""What the plugin fixes in fairseq on import (fairseq_widearch/fairseq_fixes.py): the registry (each fix
declared once, the off switch, each pinned to the fairseq it was written for), the fixes' own units,
and the matrix's rows of the launchers that run in this process: each fix's guard (tests/fix_guards.py)
under fairseq-train, ``python -m fairseq_cli.train``, fairseq-hydra-train and the decoders, where the
registry says it is tested (torchrun's and fairseq's spawn's rows: tests/test_fairseq_fixes_launched.py)."""
import os
import re
import subprocess
import sys
from argparse import Namespace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fairseq.data import data_utils
from fairseq.tasks.translation import TranslationTask

from fairseq_widearch import fairseq_fixes
from fairseq_widearch.fairseq_fixes import DECODING, FIXES, TRAINING, training_criterion_error
from fairseq_widearch.model_builder import build_model
from fix_guards import ELSEWHERE, GUARDS, MATRIX, PLUGIN, PROCESSES, SENTENCES, dummy_runs
from testing_utils import REPO, TINY_CASES, fairseq, train


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


def _changed(indices, *args, **kwargs):  # another fairseq's function: a source of its own
    return [indices]


@pytest.mark.parametrize("fix_name,target,change", [
    ("keep_last_batch", "fairseq.data.data_utils:batch_by_size", _changed),
    ("resume_patience", "fairseq.trainer:Trainer.load_checkpoint", _changed),  # a method; its pair is left too
    ("prefetching_stops_at_exit", "fairseq.data.iterators:BufferedIterator._create_consumer", None),  # gone
    ("finished_runs_stay_finished", "fairseq_cli.train:main", _changed),  # what it relies on, not what it replaces
])
def test_a_changed_or_missing_target_is_left_alone_with_one_warning(fix_name, target, change, monkeypatch):
    (owner, attribute), = fairseq_fixes.owners(target)
    for t in FIXES[fix_name].replaces:  # as fairseq has them (monkeypatch puts the fixed ones back)
        monkeypatch.setattr(*fairseq_fixes.owners(t)[0], getattr(*fairseq_fixes.owners(t)[0]).__wrapped__)
    if change is None:
        monkeypatch.delattr(owner, attribute)
    else:
        monkeypatch.setattr(owner, attribute, change)
    monkeypatch.setattr(fairseq_fixes, "_WARNED", set())
    reason = "it is not there" if change is None else r"its source \(sha256 \w+\) differs"
    with pytest.warns(fairseq_fixes.FixNotApplied, match=f"fix {fix_name} not applied: {target}: {reason}") as warned:
        fairseq_fixes.apply_fixes()
        fairseq_fixes.apply_fixes()
    assert len([w for w in warned if fix_name in str(w.message)]) == 1
    assert all(fix_name not in fairseq_fixes.fixes_on(getattr(*fairseq_fixes.owners(t)[0]))
               for t in FIXES[fix_name].replaces if t != target or change is not None)


def test_a_replaced_target_no_pin_covers_that_is_gone_is_one_warning(monkeypatch):
    """pytorch_ddp_on_cpu pins the function that builds DistributedDataParallel, not the class it replaces."""
    from fairseq.models import distributed_fairseq_model
    monkeypatch.delattr(distributed_fairseq_model, "DistributedDataParallel")
    monkeypatch.setattr(fairseq_fixes, "_WARNED", set())
    monkeypatch.setattr(fairseq_fixes, "APPLIED", fairseq_fixes.APPLIED - {"pytorch_ddp_on_cpu"})
    with pytest.warns(fairseq_fixes.FixNotApplied, match="fix pytorch_ddp_on_cpu not applied: "
                      "fairseq.models.distributed_fairseq_model:DistributedDataParallel: it is not there"):
        fairseq_fixes.apply_fixes()
    assert "pytorch_ddp_on_cpu" not in fairseq_fixes.APPLIED and "keep_last_batch" in fairseq_fixes.APPLIED


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
from testing_utils import TINY_CASES, fairseq, dummy_translation_data, hydra_config, train
assert fairseq_fixes.APPLIED == set(), fairseq_fixes.APPLIED
assert not any(fairseq_fixes.fixes_on(getattr(*place)) for fix in fairseq_fixes.FIXES.values()
               for target in fix.replaces for place in fairseq_fixes.owners(target))
tmp = Path({tmp!r})
data = dummy_translation_data(tmp)
for arch, flags in TINY_CASES.items():
    train(data, tmp / arch, arch, *flags, max_update=3)
    out = fairseq("generate", data, "--user-dir", {plugin!r}, "--path", tmp / arch / "checkpoint_last.pt",
                  "--gen-subset", "test", "--batch-size", "8", "--required-batch-size-multiple", "1", "--beam", "1",
                  "--max-len-b", "3", "--cpu", "--num-workers", "0", *flags[:2])
    print(arch, out.stdout.count("H-"))
try:  # the one that cannot: latent depth's preset reaches its criterion under hydra through a fix
    fairseq("hydra-train", *hydra_config([data, "--user-dir", {plugin!r}, "--arch", "latent_depth_transformer_tiny",
            "--criterion", "latent_depth_label_smoothed_cross_entropy", "--optimizer", "adam", "--lr", "0.001",
            "--max-tokens", "1024", "--cpu", "--max-update", "1", "--save-dir", tmp / "hydra"], tmp))
except AssertionError as refused:
    print("hydra", [line for line in str(refused).splitlines() if "presets_reach_the_criterion" in line][-1:])
"""


@pytest.mark.slow
@pytest.mark.e2e
def test_with_every_fix_off_each_architecture_trains_and_decodes_through_stock_fairseq(tmp_path):
    """As stock fairseq under torch >= 2.6 decodes at all: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, and
    --required-batch-size-multiple 1 for every sentence; fairseq-hydra-train's refusal of latent depth
    (its preset's schedule does not reach the criterion) names the fix."""
    code = NO_FIXES_FLOW.format(tmp=str(tmp_path), plugin=str(PLUGIN))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO / "tests",
                          env={**os.environ, "FAIRSEQ_WIDEARCH_FIXES": "none", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
                               "PYTHONPATH": str(REPO / "tests")})
    decoded = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.count(" ") >= 1)
    refused = decoded.pop("hydra", "")
    assert decoded == {arch: str(SENTENCES) for arch in TINY_CASES}, proc.stderr[-3000:]
    assert "--latent-objective released needs" in refused, proc.stderr[-3000:]
    assert "under fairseq-hydra-train it reaches the criterion through the fix presets_reach_the_criterion, " \
           "which is not applied" in refused


# ---- the fixes' own units ----

@pytest.mark.parametrize("size,max_sentences", [(461, 16), (1014, 64), (3003, 128), (7, None)])
def test_batch_by_size_keeps_the_remainder_as_its_own_batch(size, max_sentences):
    lengths = np.random.default_rng(0).integers(3, 60, size)
    indices = np.argsort(lengths, kind="mergesort")
    batches = data_utils.batch_by_size(indices, lengths.__getitem__, num_tokens_vec=lengths[indices],
                                       max_tokens=4096, max_sentences=max_sentences, required_batch_size_multiple=8)
    assert np.array_equal(np.concatenate(batches), indices)  # every sentence once, in order
    assert all(len(b) % 8 == 0 for b in batches[:-1])


STOCK_TINY = ["--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-layers", "1",
              "--decoder-layers", "1", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


def translation_task(data):
    args = Namespace(data=str(data), source_lang="en", target_lang="de", left_pad_source=True,
                     left_pad_target=False, dataset_impl=None, upsample_primary=-1, load_alignments=False,
                     truncate_source=False, num_batch_buckets=0, train_subset="train", required_seq_len_multiple=1,
                     max_source_positions=1024, max_target_positions=1024, eval_bleu=False)
    task = TranslationTask.setup_task(args)
    for split in ("train", "valid"):
        task.load_dataset(split)
    return task


def batches(task, split, shuffle, max_tokens=1024):
    dataset = task.dataset(split)
    # as fairseq-train builds its iterators (default --required-batch-size-multiple 8)
    itr = task.get_batch_iterator(dataset, max_tokens=max_tokens, max_positions=(1024, 1024),
                                  required_batch_size_multiple=8, seed=1, disable_iterator_cache=True)
    return list(itr.next_epoch_itr(shuffle=shuffle)), len(dataset)


def test_validation_counts_every_sentence(dummy_bin):
    valid, size = batches(translation_task(dummy_bin), "valid", shuffle=False)
    assert size == 37  # not a multiple of 8: fairseq dropped the 5 sentences of the last batch
    assert sum(sample["nsentences"] for sample in valid) == size


def test_one_training_epoch_visits_every_sentence(dummy_bin):
    # at 512 tokens a batch holds the 37 sentences but for the last 5, which fairseq dropped
    train_batches, size = batches(translation_task(dummy_bin), "train", shuffle=True, max_tokens=512)
    ids = torch.cat([sample["id"] for sample in train_batches])
    assert sorted(ids.tolist()) == list(range(size))


@pytest.mark.slow
def test_generate_emits_one_hypothesis_per_sentence_for_a_stock_transformer(multi30k_bin, tmp_path):
    """docs/fairseq_fixes.md's table: Multi30k val's 1,014 sentences (stock fairseq: 1,008)."""
    train(multi30k_bin, tmp_path, "transformer", *STOCK_TINY, max_update=1)
    gen = fairseq("generate", multi30k_bin, "--user-dir", PLUGIN, "--path", tmp_path / "checkpoint_last.pt",
                  "--gen-subset", "valid", "--max-sentences", "128", "--beam", "1", "--max-len-b", "3", "--cpu")
    assert len(re.findall(r"^H-\d+\t", gen.stdout, re.M)) == 1014
    assert "Translated 1,014 sentences" in gen.stderr


class RecordedScaler:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


@pytest.mark.parametrize("amp_init_scale,window,expected", [
    (4.0, 50, {"init_scale": 4.0, "growth_interval": 50}),
    (128.0, None, {"init_scale": 128.0}),  # no window: torch's default growth interval
])
def test_amp_loss_scaler_obeys_the_amp_flags(amp_init_scale, window, expected, monkeypatch):
    """fairseq built it from --fp16-init-scale, and grew it every --amp-init-scale updates when
    --amp-scale-window was set."""
    from fairseq.optim.amp_optimizer import AMPOptimizer
    monkeypatch.setattr(torch.cuda.amp, "GradScaler", RecordedScaler)
    common = Namespace(fp16_init_scale=64.0, amp_init_scale=amp_init_scale, amp_scale_window=window,
                       min_loss_scale=1e-4)
    optimizer = AMPOptimizer(Namespace(optimizer=Namespace(), common=common), [], None)
    assert optimizer._grad_scaler.kwargs == expected


def test_models_without_auxiliary_losses_train_with_any_criterion():
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
    criterion = LabelSmoothedCrossEntropyCriterion(SimpleNamespace(target_dictionary=None), False, 0.1)
    for arch, argv in [("widenet_tiny", ["--widenet-dense-ffn"]), ("multipath_transformer_tiny", []),
                       ("partialformer_tiny", [])]:
        assert training_criterion_error(None, build_model(arch, argv, vocab_size=40), criterion) is None
    assert "moe_label_smoothed_cross_entropy" in training_criterion_error(None, build_model("widenet_tiny", vocab_size=40),
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
