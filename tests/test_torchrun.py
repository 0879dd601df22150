"""torchrun's variables give fairseq its world size, rank and device
(``fairseq_widearch.fairseq_fixes.torchrun_joins_one_group``), each restart's rendezvous keys are its
own, and BMUF and PyTorch's DDP take what the job runs with: the functions' units. The workers'
runs under torchrun and fairseq's spawn: tests/test_fairseq_fixes_launched.py; a group restarted
after a lost worker: tests/test_lost_worker.py."""

import argparse

import pytest
import torch
from fairseq import options
from fairseq.dataclass.configs import DistributedTrainingConfig
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.models.distributed_fairseq_model import DistributedFairseqModel

from fairseq_widearch import fairseq_fixes

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
