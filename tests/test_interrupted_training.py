"""Long runs survive interruptions: a run killed with SIGKILL after a checkpoint resumes with the
same command and finishes; N + N updates with a resume in between give the parameters of 2N
uninterrupted updates, bit for bit, for every architecture (data-iterator position, optimizer
state and per-update seeds restored); an unreadable checkpoint fails with a message naming it."""
import os
import re
import signal
import subprocess

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_widearch.checkpoint_loading import CheckpointReadError
from testing_utils import REPO, TINY_ARCHS, TRAIN_FLAGS, criterion_for, fairseq, fairseq_cli, run, train

#: Flags an architecture needs beyond the defaults to train as intended.
ARCH_FLAGS = {"scalable_transformer_tiny": ["--task", "scalable_translation", "--criterion",
                                            "scalable_self_distillation", "--distill-stage", "2",
                                            "--lambda2-anneal-updates", "4"]}


@pytest.mark.slow
@pytest.mark.e2e
def test_sigkill_after_a_checkpoint_then_the_same_command_resumes_and_finishes(multi30k_bin, tmp_path):
    cmd = [str(c) for c in [fairseq_cli("train"), multi30k_bin, "--user-dir", REPO / "fairseq_widearch", "--arch",
                            "multipath_transformer_tiny", "--save-dir", tmp_path, "--max-update", "40",
                            "--save-interval-updates", "3", *TRAIN_FLAGS,
                            *criterion_for("multipath_transformer_tiny")]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if "Saved checkpoint" in line:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    saved = torch.load(tmp_path / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"]
    assert 3 <= saved < 40
    log = run(cmd).stdout
    assert f"Loaded checkpoint {tmp_path / 'checkpoint_last.pt'} (epoch 1 @ {saved} updates)" in log
    assert "done training" in log and torch.load(tmp_path / "checkpoint_last.pt")["optimizer_history"][-1][
        "num_updates"] == 40


@pytest.mark.slow
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_n_plus_n_updates_with_a_resume_equal_2n_uninterrupted(arch, multi30k_bin, tmp_path):
    extra = ARCH_FLAGS.get(arch, [])
    train(multi30k_bin, tmp_path / "whole", arch, *extra, max_update=6)
    train(multi30k_bin, tmp_path / "split", arch, *extra, max_update=3)
    resumed = train(multi30k_bin, tmp_path / "split", arch, *extra, max_update=6).stdout
    assert "(epoch 1 @ 3 updates)" in resumed
    whole, split = (torch.load(tmp_path / d / "checkpoint_last.pt")["model"] for d in ("whole", "split"))
    assert whole.keys() == split.keys()
    for name in whole:
        assert torch.equal(whole[name], split[name]), f"{name} differs after the resume"


@pytest.mark.slow
def test_unreadable_checkpoints_fail_naming_the_file(multi30k_bin, tmp_path):
    train(multi30k_bin, tmp_path, "multipath_transformer_tiny", max_update=1)
    last = tmp_path / "checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[:4096])  # truncated
    expected = re.escape(f"cannot read checkpoint {last} (truncated or corrupted?)")
    with pytest.raises(AssertionError, match="(?s)exited 2\n.*" + expected):  # one line, as in the programs' processes
        train(multi30k_bin, tmp_path, "multipath_transformer_tiny", max_update=2)
    with pytest.raises(CheckpointReadError, match=expected):
        checkpoint_utils.load_checkpoint_to_cpu(str(last))  # the hub's and scripts' error
    with pytest.raises(AssertionError, match="(?s)exited 2\n.*" + expected):
        fairseq("generate", multi30k_bin, "--user-dir", REPO / "fairseq_widearch", "--path", last, "--cpu")
