"""What the plugin fixes in fairseq on import (fairseq_widearch/fairseq_fixes.py): every sentence is
batched (training, validation, decoding, stock architectures too), and no criterion silently drops
a model's auxiliary losses."""
import re
import subprocess
import sys
from argparse import Namespace

import numpy as np
import pytest
import torch
from fairseq.data import data_utils
from fairseq.tasks.translation import TranslationTask

from fairseq_widearch.fairseq_fixes import auxiliary_criterion_error
from fairseq_widearch.model_builder import build_model
from testing_utils import REPO, fairseq, train

STOCK_TINY = ["--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-layers", "1",
              "--decoder-layers", "1", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


@pytest.mark.parametrize("size,max_sentences", [(461, 16), (1014, 64), (3003, 128), (7, None)])
def test_batch_by_size_keeps_the_remainder_as_its_own_batch(size, max_sentences):
    lengths = np.random.default_rng(0).integers(3, 60, size)
    indices = np.argsort(lengths, kind="mergesort")
    batches = data_utils.batch_by_size(indices, lengths.__getitem__, num_tokens_vec=lengths[indices],
                                       max_tokens=4096, max_sentences=max_sentences, required_batch_size_multiple=8)
    assert np.array_equal(np.concatenate(batches), indices)  # every sentence once, in order
    assert all(len(b) % 8 == 0 for b in batches[:-1])


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


def test_validation_counts_every_sentence(multi30k_bin):
    valid, size = batches(translation_task(multi30k_bin), "valid", shuffle=False)
    assert size == 1014 and size % 8  # Multi30k val, whose 6 longest sentences fairseq dropped
    assert sum(sample["nsentences"] for sample in valid) == size


def test_one_training_epoch_visits_every_sentence(multi30k_bin):
    # at 512 tokens the longest batch holds one sentence, which fairseq dropped
    train_batches, size = batches(translation_task(multi30k_bin), "train", shuffle=True, max_tokens=512)
    ids = torch.cat([sample["id"] for sample in train_batches])
    assert sorted(ids.tolist()) == list(range(size))


@pytest.mark.slow
def test_generate_emits_one_hypothesis_per_sentence_for_a_stock_transformer(multi30k_bin, tmp_path):
    train(multi30k_bin, tmp_path, "transformer", *STOCK_TINY, max_update=1)
    gen = fairseq("generate", multi30k_bin, "--user-dir", REPO / "fairseq_widearch", "--path",
                  tmp_path / "checkpoint_last.pt", "--gen-subset", "valid", "--max-sentences", "128", "--beam", "1",
                  "--max-len-b", "3", "--cpu")
    assert len(re.findall(r"^H-\d+\t", gen.stdout, re.M)) == 1014
    assert "Translated 1,014 sentences" in gen.stderr


@pytest.mark.parametrize("arch,criterion", [("widenet_tiny", "moe_label_smoothed_cross_entropy"),
                                            ("latent_depth_transformer_tiny",
                                             "latent_depth_label_smoothed_cross_entropy")])
@pytest.mark.slow
def test_training_without_the_auxiliary_criterion_stops_at_start_up(arch, criterion, multi30k_bin, tmp_path):
    with pytest.raises(ValueError) as failure:
        train(multi30k_bin, tmp_path, arch, "--criterion", "label_smoothed_cross_entropy")
    message = str(failure.value)
    assert f"train with --criterion {criterion}" in message and "--criterion label_smoothed_cross_entropy" in message
    log = "\n".join(failure.value.__notes__)
    assert "fairseq_cli.train | task:" in log and "num_updates" not in log  # stopped before the first update


def test_models_without_auxiliary_losses_train_with_any_criterion():
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
    from types import SimpleNamespace
    criterion = LabelSmoothedCrossEntropyCriterion(SimpleNamespace(target_dictionary=None), False, 0.1)
    for arch, argv in [("widenet_tiny", ["--widenet-dense-ffn"]), ("multipath_transformer_tiny", []),
                       ("partialformer_tiny", [])]:
        assert auxiliary_criterion_error(build_model(arch, argv, vocab_size=40), criterion) is None
    assert "moe_label_smoothed_cross_entropy" in auxiliary_criterion_error(build_model("widenet_tiny", vocab_size=40),
                                                                           criterion)


def epochs_trained(data, save_dir, max_epoch):
    """Run (or resume) a stock tiny Transformer whose validation loss never improves (lr 0) under
    ``--patience 2`` until ``max_epoch``; -> the epochs this call trained."""
    out = train(data, save_dir, "transformer", *STOCK_TINY, "--lr", "0", "--patience", "2", "--max-epoch", max_epoch,
                max_update=0, validate=True).stdout
    return [int(n) for n in re.findall(r"end of epoch (\d+)", out)]


@pytest.mark.slow
def test_a_resumed_run_keeps_its_patience(multi30k_slice_bin, tmp_path):
    # Uninterrupted: epoch 1 sets the best, epochs 2 and 3 do not improve on it, so it stops after 3.
    assert epochs_trained(multi30k_slice_bin, tmp_path / "whole", 10) == [1, 2, 3]
    # Interrupted after epoch 2 and resumed: it must stop after epoch 3 too (stock fairseq: 5).
    assert epochs_trained(multi30k_slice_bin, tmp_path / "resumed", 2) == [1, 2]
    assert epochs_trained(multi30k_slice_bin, tmp_path / "resumed", 10) == [3]


@pytest.mark.slow
def test_running_a_finished_training_again_trains_nothing(multi30k_slice_bin, tmp_path):
    train(multi30k_slice_bin, tmp_path, "transformer", *STOCK_TINY, max_update=2)
    before = torch.load(tmp_path / "checkpoint_last.pt")
    again = train(multi30k_slice_bin, tmp_path, "transformer", *STOCK_TINY, max_update=2).stdout
    after = torch.load(tmp_path / "checkpoint_last.pt")
    assert "nothing to train: the checkpoint has 2 updates" in again  # stock fairseq: a third update
    assert after["optimizer_history"][-1]["num_updates"] == 2
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"])
    # a larger --max-update resumes as before
    more = train(multi30k_slice_bin, tmp_path, "transformer", *STOCK_TINY, max_update=3).stdout
    assert "num_updates 3" in more


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


@pytest.mark.parametrize("tool,flags,listed", [
    ("train", ["--arch", "widenet_tiny", "--criterion", "moe_label_smoothed_cross_entropy"],
     ["--moe-capacity-factor", "--moe-balance-weight", "--max-tokens"]),
    ("generate", ["--task", "scalable_translation"], ["--eval-width", "--beam"])])
def test_help_lists_the_flags_of_the_architecture_task_and_criterion(tool, flags, listed):
    """No data directory given, as a user asking for help gives none."""
    out = fairseq(tool, "--user-dir", REPO / "fairseq_widearch", *flags, "--help")
    assert [flag for flag in listed if flag not in out.stdout] == []


def test_help_with_an_unknown_architecture_names_it_as_without_help():
    with pytest.raises(AssertionError, match="exited 2") as failed:
        fairseq("train", "--user-dir", REPO / "fairseq_widearch", "--arch", "widenet_tinyy", "--help")
    assert "invalid choice: 'widenet_tinyy'" in str(failed.value)
