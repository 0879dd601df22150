"""torchrun launches data-parallel training: its workers join one process group whatever fairseq's
default world size (``fairseq_widearch.fairseq_fixes.torchrun_joins_one_group``), on the CPU with
gloo as on GPUs, and train as the same ranks started by hand do."""

import argparse
import pickle
import subprocess
import sys

import pytest
import torch
from fairseq import options
from fairseq.dataclass.configs import DistributedTrainingConfig
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.models.distributed_fairseq_model import DistributedFairseqModel

from fairseq_widearch import fairseq_fixes

from testing_utils import BIN, REPO, TINY_ARCHS, TINY_CASES, criterion_for, ddp_train, free_port, run

TORCHRUN = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def inferred(monkeypatch, env, **flags):
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg = DistributedTrainingConfig(**{"tpu": False, **flags})  # (tpu interpolates common.tpu in a full config)
    distributed_utils.infer_init_method(cfg)
    return cfg


def test_torchrun_workers_take_world_size_rank_and_device_from_its_variables(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # a CPU machine, whatever this one has
    cfg = inferred(monkeypatch, TORCHRUN)  # the default world size: the local GPUs, at least 1
    assert (cfg.distributed_init_method, cfg.distributed_world_size, cfg.distributed_rank) == ("env://", 4, 3)
    assert cfg.device_id == 1 and cfg.distributed_no_spawn  # LOCAL_RANK, not RANK % the GPUs (none)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # a launcher that gives each worker its own GPU
    assert inferred(monkeypatch, TORCHRUN, distributed_world_size=4).device_id == 0
    assert inferred(monkeypatch, TORCHRUN, distributed_world_size=4).distributed_world_size == 4


def test_a_world_size_flag_that_disagrees_with_torchrun_fails(monkeypatch):
    with pytest.raises(ValueError, match="--distributed-world-size 3 under torchrun's WORLD_SIZE=4"):
        inferred(monkeypatch, TORCHRUN, distributed_world_size=3)


def test_without_torchrun_or_with_one_worker_fairseq_decides_as_before(monkeypatch):
    assert inferred(monkeypatch, {}).distributed_init_method is None
    assert inferred(monkeypatch, {**TORCHRUN, "WORLD_SIZE": "1", "RANK": "0"}).distributed_init_method is None
    given = inferred(monkeypatch, TORCHRUN, distributed_init_method="tcp://127.0.0.1:1234")
    assert (given.distributed_init_method, given.distributed_rank) == ("tcp://127.0.0.1:1234", 0)


def torchrun_train(data, save, arch, *extra, max_update=3):
    """``torchrun --nproc-per-node 2 -m fairseq_cli.train`` on the CPU with gloo, no world-size flag;
    the flags of testing_utils.ddp_train. Returns rank 0's checkpoint's model and the output."""
    cmd = [BIN / "torchrun", "--nproc-per-node", 2, "--master-port", free_port(), "-m", "fairseq_cli.train", data,
           "--user-dir", REPO / "fairseq_widearch", "--arch", arch, "--save-dir", save, "--max-update", max_update,
           "--cpu", "--num-workers", 0, "--optimizer", "adam", "--lr", 0.001, "--max-tokens", 512, "--seed", 1,
           "--disable-validation", "--no-epoch-checkpoints", "--ddp-backend", "legacy_ddp",
           "--distributed-backend", "gloo", *criterion_for(arch), *extra]
    out = run(cmd).stdout
    return torch.load(save / "checkpoint_last.pt", weights_only=False)["model"], out


#: widenet_tiny's case is tests/test_lost_worker.py's: under torchrun, with a worker lost and the group
#: restarted, it ends with the parameters of its two ranks started by hand.
@pytest.mark.slow
@pytest.mark.parametrize("arch", [arch for arch in TINY_ARCHS if arch != "widenet_tiny"])
@pytest.mark.e2e
def test_every_tiny_preset_trains_under_torchrun_as_two_ranks_started_by_hand(arch, multi30k_bin, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # both ways alike (torchrun would set it to 1)
    (tmp_path / "by_hand").mkdir()
    by_hand, _ = ddp_train(multi30k_bin, tmp_path / "by_hand", arch, *TINY_CASES[arch])
    state, out = torchrun_train(multi30k_bin, tmp_path / "torchrun", arch, *TINY_CASES[arch])
    assert "initialized host" in out and out.count("| epoch 001 |") == 1  # one group: rank 0 alone logs
    assert state.keys() == by_hand[0].keys()
    differ = {k: (state[k] - by_hand[0][k]).abs().max().item() for k in state if not torch.equal(state[k], by_hand[0][k])}
    assert differ == {}, arch


def test_where_torchrun_shares_its_store_each_attempt_joins_under_its_own_keys(monkeypatch):
    """torchrun's agent keeps one store for every attempt (torch 2.13): a restarted group that read
    the lost group's keys waited for peers that were gone. The workers' init method puts each
    attempt's keys under its own prefix."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    agent = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {**TORCHRUN, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(agent.port), "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "1"}
    cfg = inferred(monkeypatch, {**env, "WORLD_SIZE": "4", "RANK": "3", "LOCAL_WORLD_SIZE": "2"})
    assert cfg.distributed_init_method == fairseq_fixes.ATTEMPT_INIT_METHOD
    assert cfg.distributed_num_procs == 2  # the workers on this machine, as the logged config says
    assert inferred(monkeypatch, {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "False"}).distributed_init_method == "env://"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store, rank, world = next(torch.distributed.rendezvous(fairseq_fixes.ATTEMPT_INIT_METHOD, 0, 1))
    store.set("key", "attempt 1's")
    assert (rank, world) == (0, 1)
    assert agent.check(["attempt_1/key"]) and not agent.check(["key"])
    assert agent.get("attempt_1/key") == b"attempt 1's"


def test_restarts_over_several_machines_sharing_the_store_stop_at_start_up(monkeypatch):
    """Agents of several machines count their restarts apart: a restart under a shared store would
    wait 30 minutes for the process group's timeout. Such a job stops at once, naming the form that
    restarts; without --max-restarts, or with a store per attempt, it runs."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    several = {**TORCHRUN, "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    with pytest.raises(ValueError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --rdzv-backend c10d"):
        inferred(monkeypatch, {**several, "TORCHELASTIC_MAX_RESTARTS": "1"})
    assert inferred(monkeypatch, {**several, "TORCHELASTIC_MAX_RESTARTS": "0"}).distributed_init_method == \
        fairseq_fixes.ATTEMPT_INIT_METHOD
    assert inferred(monkeypatch, {**several, "TORCHELASTIC_MAX_RESTARTS": "1",
                                  "TORCHELASTIC_USE_AGENT_STORE": "False"}).distributed_init_method == "env://"


def test_bmuf_takes_the_world_size_the_job_runs_with(monkeypatch):
    """fairseq copies --distributed-world-size into BMUF's config as it parses the command line,
    before torchrun's or SLURM's variables give the world size: BMUF read 1 and never synchronised."""
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), [
        "data", "--arch", "transformer", "--cpu", "--use-bmuf"]))
    cfg.distributed_training.distributed_world_size, cfg.distributed_training.distributed_rank = 4, 3
    monkeypatch.setattr(distributed_utils, "distributed_init", lambda cfg: cfg.distributed_training.distributed_rank)
    seen = []
    distributed_utils.distributed_main(0, lambda cfg: seen.append(cfg.bmuf.distributed_world_size), cfg, {})
    assert seen == [4]


@pytest.mark.slow
@pytest.mark.e2e
def test_fairseqs_spawned_workers_take_bmufs_world_size_too():
    """fairseq's own spawn (SLURM with a task per machine, several GPUs) pickles distributed_main by
    name: a process that has not imported the plugin, unpickling it, imports the plugin and runs it."""
    code = ("import pickle, sys; main = pickle.loads(sys.stdin.buffer.read()); "
            "from fairseq.distributed import utils; print(main is utils.distributed_main, main.__module__)")
    proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(distributed_utils.distributed_main),
                          capture_output=True, timeout=120)
    assert proc.stdout.decode().split() == ["True", "fairseq_widearch.fairseq_fixes"], proc.stderr.decode()[-3000:]


def test_pytorch_ddp_wraps_a_model_on_the_cpu(tmp_path):
    """fairseq's default --ddp-backend gave a CPU module device_ids=[--device-id], which PyTorch refuses."""
    args = argparse.Namespace(ddp_backend="pytorch_ddp", device_id=1, broadcast_buffers=False, bucket_cap_mb=25,
                              find_unused_parameters=False, gradient_as_bucket_view=False, ddp_comm_hook="none",
                              tpu=False)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        wrapped = DistributedFairseqModel(args, torch.nn.Linear(2, 2), torch.distributed.group.WORLD, torch.device("cpu"))
        assert wrapped.module.device_ids is None
    finally:
        torch.distributed.destroy_process_group()
