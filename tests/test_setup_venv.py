"""examples/setup_venv.sh, behind both README commands, chooses a Python that our fairseq has
wheels for (CPython 3.11 or 3.12), with fake interpreters on PATH: ``$PYTHON`` if set; else
``python3`` if it is 3.11 or 3.12; else ``python3.12``, then ``python3.11``; with none, it stops
before creating anything; an existing virtualenv of another version is not reused."""
import subprocess

import pytest

from testing_utils import REPO

pytestmark = pytest.mark.e2e  # each test's subject is a process

SCRIPT = REPO / "examples" / "setup_venv.sh"


def fake_python(folder, name, version):
    """An executable ``folder/name`` that answers the version question as CPython ``version`` does."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/bash\necho {version}\n")
    path.chmod(0o755)
    return path


def setup_venv(tmp_path, pythons, *args, env=None):
    """Run the script with only ``pythons`` ({name: version}) on PATH and $VENV in tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, version in pythons.items():
        fake_python(bin_dir, name, version)
    return subprocess.run(["/bin/bash", SCRIPT, *args], capture_output=True, text=True,
                          env={"PATH": str(bin_dir), "VENV": str(tmp_path / "venv"), **(env or {})})


@pytest.mark.parametrize("pythons,chosen", [
    ({"python3": "3.13", "python3.11": "3.11"}, "python3.11"),
    ({"python3": "3.14", "python3.12": "3.12", "python3.11": "3.11"}, "python3.12"),
    ({"python3": "3.12", "python3.11": "3.11"}, "python3"),
    ({"python3": "3.11"}, "python3"),
])
def test_the_first_supported_python_is_taken(tmp_path, pythons, chosen):
    proc = setup_venv(tmp_path, pythons, "--print-python")
    assert proc.returncode == 0 and proc.stdout.strip() == chosen, proc.stderr


def test_python_from_the_environment_comes_first_and_must_be_supported(tmp_path):
    mine = fake_python(tmp_path / "elsewhere", "py", "3.12")
    proc = setup_venv(tmp_path, {"python3": "3.11"}, "--print-python", env={"PYTHON": str(mine)})
    assert proc.stdout.strip() == str(mine)
    old = fake_python(tmp_path / "elsewhere", "old", "3.10")
    proc = setup_venv(tmp_path, {"python3": "3.11"}, "--print-python", env={"PYTHON": str(old)})
    assert proc.returncode == 1 and f"PYTHON={old} is Python 3.10" in proc.stderr


@pytest.mark.parametrize("pythons", [{"python3": "3.13"}, {}])
def test_without_a_supported_python_it_stops_before_creating_anything(tmp_path, pythons):
    proc = setup_venv(tmp_path, pythons)
    assert proc.returncode == 1 and not (tmp_path / "venv").exists()
    message = proc.stderr.strip()
    assert len(message.splitlines()) == 1 and "3.11 or 3.12" in message and "PYTHON=" in message
    assert ("python3 is 3.13" if pythons else "no python3 on PATH") in message


def test_an_existing_virtualenv_of_another_version_is_not_reused(tmp_path):
    fake_python(tmp_path / "venv" / "bin", "python", "3.13")
    proc = setup_venv(tmp_path, {"python3": "3.12"})
    assert proc.returncode == 1 and "is a Python 3.13 virtualenv" in proc.stderr and "rm -rf" in proc.stderr
