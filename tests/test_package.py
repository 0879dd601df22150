"""Installation and registration: --user-dir from the repo root and from anywhere."""
import os
import subprocess

import fairseq_widearch
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

from conftest import REPO, fairseq_cli
from models.test_multipath_transformer import TABLE2_PARAMS


def test_import_registers_models_and_presets():
    assert "multipath_transformer" in MODEL_REGISTRY
    for preset in list(TABLE2_PARAMS) + ["multi30k", "tiny"]:
        assert f"multipath_transformer_{preset}" in ARCH_MODEL_REGISTRY


def _arch_help(user_dir, cwd):
    """fairseq-train accepts the plugin's --arch (argparse refuses unknown choices before --help)."""
    return subprocess.run([str(fairseq_cli("train")), "--user-dir", str(user_dir), "--arch", "multipath_transformer_tiny",
                           "--help"], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_user_dir_from_the_repo_root():
    proc = _arch_help("fairseq_widearch", REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_user_dir_pointing_at_the_installed_package_from_anywhere(tmp_path):
    proc = _arch_help(os.path.dirname(fairseq_widearch.__file__), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_unregistered_arch_without_the_plugin(tmp_path):
    proc = subprocess.run([str(fairseq_cli("train")), "--arch", "multipath_transformer_tiny", "--help"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "invalid choice" in proc.stderr
