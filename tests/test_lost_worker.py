"""A data-parallel training that loses a worker mid-epoch, after a checkpoint, under ``torchrun
--max-restarts``: a worker killed (SIGKILL), then, in the restarted group, one hung (SIGSTOP,
ended by ``--heartbeat-timeout``: ``fairseq_widearch.fairseq_fixes.heartbeat_ends_a_hung_job``);
each time torchrun restarts the group, fairseq resumes from checkpoint_last.pt, and the run ends
at ``--max-update`` with the parameters of an uninterrupted run, every batch trained once
(tests/helpers/faulty_worker.py makes the faults and prints each batch's sentences)."""
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from testing_utils import BIN, REPO, TRAIN_FLAGS, criterion_for, ddp_train, free_port, run, train

pytestmark = pytest.mark.e2e  # each test's subject is a process

#: Each fault comes two updates after a checkpoint: the faulty rank cannot start the second before
#: rank 0 has written the checkpoint (the first's gradients wait for rank 0 in the all-reduce).
#: Rank 1 is killed as it starts update 4 in the first attempt, and hangs as it starts update 6 in
#: the second; the third ends the run.
UPDATES, CHECKPOINT_EVERY, FAULTS = 8, 2, (("kill", 4), ("stop", 6))
HEARTBEAT = 5  # seconds


def torchrun(data, save):
    """Two gloo workers of widenet_tiny under torchrun (c10d rendezvous, a restart per fault,
    ``--heartbeat-timeout HEARTBEAT``), rank 1 failing as ``FAULTS`` says; the final checkpoint,
    per (attempt, rank, update) the sentence ids its batch held, and the output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAULT_RANK": "1",
           "FAULTS": ",".join(f"{fault}@{update}" for fault, update in FAULTS)}
    cmd = [BIN / "torchrun", "--nproc-per-node", 2, "--max-restarts", len(FAULTS), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", REPO / "tests" / "helpers" / "faulty_worker.py", data,
           "--user-dir", REPO / "fairseq_widearch", "--arch", "widenet_tiny",
           "--criterion", "moe_label_smoothed_cross_entropy", "--cpu", "--distributed-backend", "gloo",
           "--ddp-backend", "legacy_ddp", "--num-workers", 0, "--optimizer", "adam", "--lr", 0.001,
           "--max-tokens", 512, "--seed", 1, "--dropout", 0.1, "--disable-validation", "--no-epoch-checkpoints",
           "--save-interval-updates", CHECKPOINT_EVERY, "--max-update", UPDATES, "--heartbeat-timeout", HEARTBEAT,
           "--save-dir", save]
    proc = run(cmd, env=env, timeout=300)  # a hung group the heartbeat did not end fails here
    out = proc.stdout + proc.stderr  # the batches; fairseq's and torchrun's logs
    return torch.load(save / "checkpoint_last.pt", weights_only=False), batches_in(out), out


def batches_in(out):
    return {(int(a), int(r), int(u)): ids for a, r, u, ids in re.findall(r"^\| batch (\d) (\d) (\d+) (\S+)$", out, re.M)}


@pytest.fixture(scope="module")
def uninterrupted(multi30k_bin, tmp_path_factory):
    """The same training, its two ranks started by hand, whose parameters the torchrun runs below end with."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        states, outs = ddp_train(multi30k_bin, tmp_path_factory.mktemp("uninterrupted"), "widenet_tiny",
                                 "--dropout", 0.1, "--save-interval-updates", CHECKPOINT_EVERY,
                                 max_update=UPDATES, worker="faulty_worker.py")
    return states[0], batches_in("".join(outs))


@pytest.mark.slow
@pytest.mark.guards("heartbeat_ends_a_hung_job", "torchrun")
def test_a_killed_then_a_hung_worker_restart_the_group_which_resumes_and_ends_as_an_uninterrupted_run(
        uninterrupted, multi30k_bin, tmp_path):
    """Each fault makes torchrun restart the group (the hung worker's peer, waiting in the
    all-reduce, ended by the heartbeat: without it, gloo's 30 minutes, past this test's timeout),
    fairseq resumes from the last checkpoint each time, and the run ends with the uninterrupted
    run's parameters, every update trained on its batch."""
    state, batches, out = torchrun(multi30k_bin, tmp_path)
    expected_state, expected_batches = uninterrupted
    assert f"Killing job for not making progress in {HEARTBEAT} seconds" in out
    for attempt, (_, update) in enumerate(FAULTS, 1):
        resumed_at = update - CHECKPOINT_EVERY
        assert f"Loaded checkpoint {tmp_path}/checkpoint_last.pt (epoch 1 @ {resumed_at} updates)" in out, attempt
    assert state["optimizer_history"][-1]["num_updates"] == UPDATES
    differ = [k for k in state["model"] if not torch.equal(state["model"][k], expected_state[k])]
    assert differ == []
    # each attempt trained from its checkpoint on, up to its fault (the faulty rank's peer may fail
    # before it draws that update's batch), every batch the uninterrupted run's of that update
    starts = [1] + [update - CHECKPOINT_EVERY + 1 for _, update in FAULTS]
    ends = [update for _, update in FAULTS] + [UPDATES]
    for rank in (0, 1):
        for attempt, (first, last) in enumerate(zip(starts, ends)):
            drawn = {u: ids for (a, r, u), ids in batches.items() if a == attempt and r == rank}
            full = attempt == len(FAULTS)
            assert set(range(first, last + full)) <= set(drawn) <= set(range(first, last + 1)), (rank, attempt)
            assert drawn == {u: expected_batches[(0, rank, u)] for u in drawn}, (rank, attempt)


@pytest.mark.slow
def test_a_kill_while_checkpoint_last_is_written_leaves_the_previous_one_whole(multi30k_bin, tmp_path):
    """fairseq saves each checkpoint and copies it to checkpoint_last.pt; a worker killed halfway
    through the copy of update 2's (``fairseq_widearch.fairseq_fixes.checkpoint_copies_are_atomic``)
    leaves update 1's checkpoint_last.pt whole, and the same command resumes from it."""
    flags = ["--save-interval-updates", "1"]
    cmd = [sys.executable, REPO / "tests" / "helpers" / "faulty_worker.py", multi30k_bin, "--user-dir",
           REPO / "fairseq_widearch", "--arch", "widenet_tiny", "--save-dir", tmp_path, "--max-update", 3,
           *TRAIN_FLAGS, *criterion_for("widenet_tiny"), *flags]
    killed = subprocess.run([str(c) for c in cmd], env={**os.environ, "FAULT": "copy", "FAULT_COPY": "2"},
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stdout[-2000:] + killed.stderr[-2000:]
    assert torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)["optimizer_history"][-1]["num_updates"] == 1
    resumed = train(multi30k_bin, tmp_path, "widenet_tiny", *flags, max_update=3)
    out = resumed.stdout + resumed.stderr
    assert "Loaded checkpoint" in out and "(epoch 1 @ 1 updates)" in out
    assert torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)["optimizer_history"][-1]["num_updates"] == 3


#: The outside kills: (torchrun's rendezvous, DDP backend, --heartbeat-timeout or None, when):
#: "checkpoint" kills rank 1 as soon as the first checkpoint_last.pt appears; "save" kills rank 0,
#: the rank that saves, while a later checkpoint is being written (a .tmp file beside
#: checkpoint_last.pt). "static" is torchrun's default rendezvous, "c10d" the manual's multi-machine one.
OUTSIDE_KILLS = [("c10d", "legacy_ddp", None, "checkpoint"), ("static", "pytorch_ddp", 30, "save")]
PLAIN_UPDATES, PLAIN_SAVE_EVERY = 16, 4


def plain_torchrun(data, save, rdzv, backend, heartbeat, kill=None):
    """The manual's CPU command under ``torchrun --max-restarts 1`` with torchrun's defaults (its
    rendezvous store shared with the workers), fairseq's entry point itself, no helper; with
    ``kill``, a worker SIGKILLed from outside as OUTSIDE_KILLS says. Returns the final checkpoint,
    whether a kill was sent, and the output."""
    rendezvous = (["--master-port", free_port()] if rdzv == "static" else
                  ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"])
    cmd = [BIN / "torchrun", "--nnodes", 1, "--nproc-per-node", 2, "--max-restarts", 1, *rendezvous,
           "-m", "fairseq_cli.train", data,
           "--user-dir", REPO / "fairseq_widearch", "--arch", "widenet_tiny",
           "--criterion", "moe_label_smoothed_cross_entropy", "--cpu", "--distributed-backend", "gloo",
           "--ddp-backend", backend, "--optimizer", "adam", "--lr", 0.001, "--max-tokens", 1024, "--seed", 1,
           "--dropout", 0.1, "--disable-validation", "--no-epoch-checkpoints",
           "--save-interval-updates", PLAIN_SAVE_EVERY, "--max-update", PLAIN_UPDATES, "--save-dir", save,
           *(["--heartbeat-timeout", heartbeat] if heartbeat else [])]
    with tempfile.TemporaryFile("w+") as log:
        job = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            killed = kill is not None and kill_when(job, save, kill)
            job.wait(timeout=300)  # a restarted group that hangs ends here
        except subprocess.TimeoutExpired:
            pass
        finally:  # torchrun and its workers, whatever happened
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
        log.seek(0)
        out = log.read()
    assert job.returncode == 0, out[-6000:]
    return torch.load(save / "checkpoint_last.pt", weights_only=False), killed, out


def kill_when(job, save, kill, timeout=300):
    """SIGKILL a worker of ``job``'s first attempt at the moment ``kill`` names; whether it was sent
    (False where the job ended, or ``timeout`` seconds passed, first)."""
    last, deadline = save / "checkpoint_last.pt", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            job.wait(timeout=0.002)
            return False
        except subprocess.TimeoutExpired:
            pass
        if kill == "checkpoint" and last.exists():
            return kill_worker(job, rank=1)
        if kill == "save" and saving(save, last):
            return kill_worker(job, rank=0)
    return False


def saving(save, last):
    """Whether a save after the first is under way: a file being written (``.tmp``), or a newer
    ``checkpoint_<epoch>_<update>.pt`` than ``checkpoint_last.pt``, which is copied from it next."""
    try:
        if not last.exists():
            return False
        newer = last.stat().st_mtime_ns
        return any(p.suffix == ".tmp" or p.name != last.name and p.stat().st_mtime_ns > newer for p in save.iterdir())
    except FileNotFoundError:  # renamed while looked at: a save under way
        return True


def kill_worker(job, rank):
    """SIGKILL the worker of ``rank`` that torchrun (``job``) started first."""
    for child in Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split():
        env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RESTART_COUNT=0" in env:
            os.kill(int(child), signal.SIGKILL)
            return True
    raise AssertionError(f"no worker of rank {rank} among torchrun's children")


@pytest.fixture(scope="module")
def plain_uninterrupted(multi30k_bin, tmp_path_factory):
    """backend -> the final checkpoint of the same job with no kill."""
    runs = {}

    def get(backend):
        if backend not in runs:
            runs[backend] = plain_torchrun(multi30k_bin, tmp_path_factory.mktemp(backend), "static", backend, None)[0]
        return runs[backend]
    return get


@pytest.mark.slow
@pytest.mark.parametrize("rdzv,backend,heartbeat,kill", OUTSIDE_KILLS)
def test_a_worker_killed_from_outside_restarts_a_plain_torchrun_job_which_ends_as_an_uninterrupted_run(
        rdzv, backend, heartbeat, kill, plain_uninterrupted, multi30k_bin, tmp_path):
    """A plain ``torchrun --max-restarts 1`` job (the rendezvous store shared with its workers, as
    torchrun does by default, with either rendezvous) loses a worker to a SIGKILL it did not choose the update of: the
    restarted group joins (``fairseq_widearch.fairseq_fixes.torchrun_joins_one_group``: a key space
    per attempt in the shared store), resumes from checkpoint_last.pt and ends at --max-update with
    the uninterrupted run's parameters."""
    state, killed, out = plain_torchrun(multi30k_bin, tmp_path, rdzv, backend, heartbeat, kill)
    assert killed
    # the logged config (each attempt's) states the world the job runs with, BMUF's included
    assert "'distributed_world_size': 1" not in out and "'distributed_num_procs': 1" not in out
    assert out.count("'distributed_world_size': 2") == 4 and out.count("'distributed_num_procs': 2") == 2
    assert re.search(rf"Loaded checkpoint {re.escape(str(tmp_path))}/checkpoint_last.pt \(epoch \d+ @ [1-9]\d* updates\)", out)
    assert state["optimizer_history"][-1]["num_updates"] == PLAIN_UPDATES
    expected = plain_uninterrupted(backend)["model"]
    assert [k for k in state["model"] if not torch.equal(state["model"][k], expected[k])] == []
