"""The fixes' matrix under the launchers that start processes (fairseq_widearch/fairseq_fixes.py):
each fix's guard (tests/fix_guards.py) under torchrun (two workers, ``-m fairseq_cli.train``) and
fairseq's own spawn (``--distributed-world-size 2`` without torchrun, tests/helpers/spawn_train.py),
on the CPU with gloo, where the registry says it is tested."""
import pytest

from fix_guards import GUARDS, MATRIX, PROCESSES, dummy_runs


@pytest.fixture(scope="module")
def launcher_runs(tmp_path_factory):
    return dummy_runs(tmp_path_factory)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("name,launcher", [row for row in MATRIX if row[1] in PROCESSES])
def test_each_fix_holds_under_each_launcher_in_processes(name, launcher, launcher_runs, monkeypatch):
    GUARDS[name](launcher_runs(launcher), monkeypatch)
