"""Installation and registration: --user-dir from the repo root and from anywhere."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

import fairseq_widearch
from testing_utils import REPO, fairseq_cli


def test_import_registers_models_and_presets():
    assert "multipath_transformer" in MODEL_REGISTRY
    for preset in ["6l_2p", "12l_2p", "6l_4p", "12l_3p", "6l_6p", "24l_2p", "12l_4p", "6l_8p", "multi30k", "tiny"]:
        assert f"multipath_transformer_{preset}" in ARCH_MODEL_REGISTRY


def _arch_help(user_dir, cwd):
    """fairseq-train accepts the plugin's --arch (argparse refuses unknown choices before --help)."""
    return subprocess.run([str(fairseq_cli("train")), "--user-dir", str(user_dir), "--arch", "multipath_transformer_tiny",
                           "--help"], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.e2e
def test_user_dir_from_the_repo_root():
    proc = _arch_help("fairseq_widearch", REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.e2e
def test_user_dir_pointing_at_the_installed_package_from_anywhere(tmp_path):
    proc = _arch_help(os.path.dirname(fairseq_widearch.__file__), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.e2e
def test_unregistered_arch_without_the_plugin(tmp_path):
    proc = subprocess.run([str(fairseq_cli("train")), "--arch", "multipath_transformer_tiny", "--help"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "invalid choice" in proc.stderr


def _imports(package_dir):
    """``{module: {plugin modules it imports anywhere in its file}}`` for the plugin's package, from
    the source (function-level imports count: they tie two modules just as well)."""
    root = package_dir.parent
    modules = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
               for p in package_dir.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def _cycles(graph):
    """Every import cycle, each as the list of its modules (DFS over the graph)."""
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_no_import_cycle_between_plugin_modules():
    graph = _imports(Path(fairseq_widearch.__file__).parent)
    assert "fairseq_widearch.modules.sub_transformers" in graph["fairseq_widearch.tasks.scalable_translation"]
    # package __init__ files import their submodules; a submodule importing its own package back is the cycle
    assert _cycles(graph) == []


def test_setup_py_declares_the_pythons_it_installs_on():
    """pip's own one-line refusal on Python 3.13 instead of a search for a missing wheel."""
    from packaging.specifiers import SpecifierSet
    spec = SpecifierSet(re.search(r'python_requires="([^"]+)"', (REPO / "setup.py").read_text()).group(1))
    assert "3.11" in spec and "3.12" in spec and "3.13" not in spec and sys.version.split()[0] in spec


def test_the_experiments_never_import_the_command_line_tools():
    """cli/ builds on experiments/ (counting, data, scoring), one way: what both need lies below them
    (plotting, checkpoint_loading)."""
    graph = _imports(Path(fairseq_widearch.__file__).parent)
    assert "fairseq_widearch.experiments.counting" in graph["fairseq_widearch.cli.stats"]
    upward = {(module, target) for module, targets in graph.items() if module.startswith("fairseq_widearch.experiments")
              for target in targets if target.startswith("fairseq_widearch.cli")}
    assert upward == set()


def test_the_modules_refuse_their_own_arguments_and_the_config_validation_the_flags():
    """A module (fairseq_widearch/modules) raises naming its own arguments; the command-line flags are
    named by the config validation alone (each model's ``validate``, fairseq_widearch/validation.py)."""
    flags = []
    for path in sorted((Path(fairseq_widearch.__file__).parent / "modules").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise):
                texts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
                flags += [f"{path.name}:{node.lineno}" for text in texts if re.search(r"(^|\s)--[a-z]", text)]
    assert flags == []
