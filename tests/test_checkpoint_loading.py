"""Checkpoints fairseq saved load under torch >= 2.6 with weights-only protection kept on."""
import os
import pickle
import sys
from argparse import Namespace

import pytest
import torch
from fairseq import checkpoint_utils

from testing_utils import REPO, cli, fairseq, train

ARCHS = ["transformer_tiny", "multipath_transformer_tiny"]


@pytest.fixture(scope="module", params=ARCHS)
def trained(request, multi30k_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp(request.param)
    train(multi30k_bin, save, request.param, max_update=2)
    return request.param, save


@pytest.mark.slow
@pytest.mark.e2e
def test_stock_fairseq_alone_refuses_its_own_checkpoint(trained):
    """The problem this plugin fixes: without it, torch's weights-only loading rejects fairseq's
    checkpoints (they hold an argparse.Namespace)."""
    _, save = trained
    code = ("import pickle, sys\nfrom fairseq import checkpoint_utils\n"
            "try:\n    checkpoint_utils.load_checkpoint_to_cpu(sys.argv[1])\n"
            "except pickle.UnpicklingError:\n    sys.exit(3)\n")
    proc = __import__("subprocess").run([sys.executable, "-c", code, str(save / "checkpoint_last.pt")])
    assert proc.returncode == 3


@pytest.mark.slow
def test_load_model_ensemble(trained):
    arch, save = trained
    models, cfg = checkpoint_utils.load_model_ensemble([str(save / "checkpoint_last.pt")])
    assert cfg.model.arch == arch and len(models) == 1


@pytest.mark.slow
def test_training_resumes_from_checkpoint_last(trained, multi30k_bin):
    arch, save = trained
    log = train(multi30k_bin, save, arch, max_update=4).stdout
    assert "Loaded checkpoint" in log and "@ 2 updates" in log
    assert "num_updates 4" in log


@pytest.mark.slow
def test_fairseq_interactive_translates_with_the_checkpoint(trained, multi30k_bin):
    _, save = trained
    out = fairseq("interactive", multi30k_bin, "--user-dir", REPO / "fairseq_widearch", "--path",
                  save / "checkpoint_last.pt", "--cpu", "--beam", 2, "--max-len-b", 5, "--source-lang", "en",
                  "--target-lang", "de", stdin="a man is sleeping .\n").stdout
    assert any(line.startswith("H-0") for line in out.splitlines())


class _RunsCodeWhenUnpickled:
    def __reduce__(self):
        return (os.getcwd, ())


def test_other_pickled_globals_are_still_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"args": Namespace(arch="transformer"), "model": {}, "payload": _RunsCodeWhenUnpickled()}, path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    with pytest.raises(pickle.UnpicklingError, match="getcwd"):
        torch.load(path)


def test_protection_is_not_switched_off_globally():
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ
    import inspect
    assert inspect.signature(torch.load).parameters["weights_only"].default is None  # torch's own default


def test_omegaconf_configs_in_old_checkpoints_load(tmp_path):
    """fairseq 0.10/0.11 stored the config as an omegaconf DictConfig."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(Namespace(arch="transformer", task="translation", _name="transformer"))
    torch.save({"cfg": cfg, "model": {"w": torch.ones(2)}}, tmp_path / "old.pt")
    state = torch.load(tmp_path / "old.pt")
    assert state["cfg"].model.arch == "transformer"


def test_a_checkpoint_state_broadcast_to_the_other_workers_loads(tmp_path):
    """Rank 0 loads a checkpoint and broadcasts it to the other data-parallel workers with its
    tensors replaced by placeholders; each worker ``torch.load``s what it receives."""
    from fairseq.distributed.utils import _split_tensors_from_obj

    tensors = []
    state = _split_tensors_from_obj({"model": {"w": torch.ones(2)}, "args": Namespace(arch="transformer")}, tensors)
    torch.save(state, tmp_path / "broadcast.pt")
    assert torch.load(tmp_path / "broadcast.pt")["model"]["w"].index == 0 and len(tensors) == 1


@pytest.mark.slow
def test_average_checkpoints_of_the_last_updates(multi30k_bin, tmp_path):
    """The average of the last two interval checkpoints, loadable for decoding."""
    train(multi30k_bin, tmp_path, "transformer_tiny", "--save-interval-updates", "1", "--keep-interval-updates", "-1",
          max_update=3)
    averaging = cli("fairseq_widearch.cli.average_checkpoints", "--inputs", tmp_path, "--num-update-checkpoints", 2,
                    "--out", tmp_path / "avg.pt")
    assert averaging.returncode == 0, averaging.stderr
    states = [torch.load(tmp_path / f"checkpoint_1_{u}.pt") for u in (2, 3)]
    averaged = torch.load(tmp_path / "avg.pt")
    for name, value in averaged["model"].items():
        torch.testing.assert_close(value, (states[0]["model"][name] + states[1]["model"][name]) / 2)
    assert averaged["last_optimizer_state"] is None


def test_averaging_finds_the_interval_or_the_epoch_checkpoints_a_recipe_keeps(tmp_path):
    from fairseq_widearch.cli.average_checkpoints import latest_checkpoints
    for name in ("checkpoint_1_100.pt", "checkpoint_2_250.pt", "checkpoint_3_300.pt", "checkpoint2.pt",
                 "checkpoint10.pt", "checkpoint9.pt", "checkpoint_best.pt", "checkpoint_last.pt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in latest_checkpoints(tmp_path, 2)] == ["checkpoint_2_250.pt", "checkpoint_3_300.pt"]
    assert [p.name for p in latest_checkpoints(tmp_path, 2, "epochs")] == ["checkpoint9.pt", "checkpoint10.pt"]
    with pytest.raises(SystemExit, match="holds 3 checkpoint<epoch>.pt files, fewer than 4"):
        latest_checkpoints(tmp_path, 4, "epochs")


#: A way to run that older checkpoints stored in their model config, per preset; now chosen per
#: process (PartialFormer's attention kernel) or gone (the MoE layer's other dispatches).
WAYS_TO_RUN = {"widenet_tiny": {"moe_dispatch": "index", "moe_slots": "sort", "moe_compile": True},
               "partialformer_tiny": {"partial_attention_kernel": "explicit"}}


@pytest.mark.slow
@pytest.mark.parametrize("arch", WAYS_TO_RUN)
def test_a_checkpoint_that_stored_how_it_ran_loads_and_resumes_as_one_that_did_not(arch, multi30k_slice_bin, tmp_path,
                                                                                 monkeypatch):
    train(multi30k_slice_bin, tmp_path, arch, max_update=2)
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)
    for key, value in WAYS_TO_RUN[arch].items():
        assert not hasattr(state["cfg"]["model"], key)  # no longer saved
        setattr(state["cfg"]["model"], key, value)
    torch.save(state, tmp_path / "older.pt")
    outputs = []
    for checkpoint, kernel in (("checkpoint_last.pt", "auto"), ("older.pt", "sdpa")):
        monkeypatch.setenv("PARTIALFORMER_ATTENTION_KERNEL", kernel)  # the same outputs whichever kernel
        [model], _ = checkpoint_utils.load_model_ensemble([str(tmp_path / checkpoint)])  # as generate and the hub load
        src, prev = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[2, 8, 9, 10]])
        outputs.append(model.eval()(src, torch.tensor([4]), prev)[0])
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    resumed = train(multi30k_slice_bin, tmp_path / "resumed", arch, "--restore-file", tmp_path / "older.pt", max_update=3)
    assert "Loaded checkpoint" in resumed.stdout and (tmp_path / "resumed" / "checkpoint_last.pt").exists()
