"""The fixes' matrix under the launchers that start processes (fairseq_widearch/fairseq_fixes.py):
each fix's guard (tests/fix_guards.py) under torchrun (two workers, ``-m fairseq_cli.train``) and
fairseq's own spawn (``--distributed-world-size 2`` without torchrun, tests/helpers/spawn_train.py),
on the CPU with gloo, where the registry says it is tested; and ``python -m fairseq_cli.train`` and
fairseq-hydra-train in processes of their own, where the plugin is imported later than in the
matrix's in-process rows."""
import os
import subprocess
import sys

import pytest
import torch

from fix_guards import GUARDS, MATRIX, PROCESSES, dummy_runs, trains, updates
from testing_utils import BIN, hydra_config


@pytest.fixture(scope="module")
def launcher_runs(tmp_path_factory):
    return dummy_runs(tmp_path_factory)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("name,launcher", [row for row in MATRIX if row[1] in PROCESSES])
def test_each_fix_holds_under_each_launcher_in_processes(name, launcher, launcher_runs, monkeypatch):
    GUARDS[name](launcher_runs(launcher), monkeypatch)


def rerun_finished(command, save) -> list:
    """``command`` (a training of 2 updates into ``save``) run twice, each in a process of its own ->
    the two outputs' texts; the checkpoint must have 2 updates after each."""
    texts = []
    for _ in range(2):
        proc = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert updates(save) == 2
        texts.append(proc.stdout + proc.stderr)
    return texts


@pytest.mark.slow
@pytest.mark.e2e
def test_python_m_fairseq_cli_train_in_its_own_process_trains_a_finished_run_no_further(launcher_runs, tmp_path):
    """``python -m`` runs fairseq_cli.train as ``__main__``, which imports the plugin from inside its own
    ``main``'s parse: the fix reaches that copy at import (the in-process rows reach it at call_main)."""
    runs = launcher_runs("python -m fairseq_cli.train")
    command = [sys.executable, "-m", "fairseq_cli.train", *trains(runs.data, tmp_path, "--max-update", 2,
                                                                 "--disable-validation")]
    assert "nothing to train: the checkpoint has 2 updates" in rerun_finished(command, tmp_path)[1]


@pytest.mark.slow
@pytest.mark.e2e
def test_fairseq_hydra_train_in_its_own_process_imports_the_plugin_in_main_and_its_fixes_hold(launcher_runs,
                                                                                               tmp_path):
    """fairseq-hydra-train imports the plugin (common.user_dir) only when fairseq_cli.train's main
    starts: a finished run stays finished, and latent depth's preset reaches its criterion."""
    runs = launcher_runs("fairseq-hydra-train")
    first, again = rerun_finished([BIN / "fairseq-hydra-train", *hydra_config(
        trains(runs.data, tmp_path, "--max-update", 2, "--disable-validation"), tmp_path)], tmp_path)
    assert "nothing to train: the checkpoint has 2 updates" in again
    latent = tmp_path / "latent"
    latent.mkdir()
    subprocess.run([str(c) for c in [BIN / "fairseq-hydra-train", *hydra_config(trains(
        runs.data, latent, "--max-update", 1, "--disable-validation", arch="latent_depth_transformer_tiny",
        criterion="latent_depth_label_smoothed_cross_entropy"), latent)]], check=True, capture_output=True, timeout=600)
    saved = torch.load(latent / "checkpoint_last.pt", weights_only=False)["cfg"]["criterion"]
    assert saved["latent_kl_anneal_updates"] > 0  # the preset's, for its budget (the criterion's own: 0, refused)
