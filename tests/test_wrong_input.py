"""Every command-line tool (``python -m fairseq_widearch.cli.<tool>``) and every recipe
(``examples/**/*.sh``), each found by itself, answers ``--help`` and ``-h`` with its whole usage,
starting nothing, and ends a wrong argument in one line naming it and what it takes. A tool's
arguments are typed by ``fairseq_widearch.cli``'s types (``whole``, ``number``, ``existing``...),
and each is given the value its type refuses; a recipe's are read from its usage (``--data-dir
DIR``, ``--x N``, ``DATA_BIN``) and checked by ``examples/args.sh``."""
import argparse
import functools
import importlib
import os
import pkgutil
import re
import subprocess

import pytest

import fairseq_widearch.cli
from fairseq_widearch.cli import existing_file
from testing_utils import REPO, cli

TOOLS = [f"fairseq_widearch.cli.{m.name}" for m in pkgutil.iter_modules(fairseq_widearch.cli.__path__)
         if hasattr(importlib.import_module(f"fairseq_widearch.cli.{m.name}"), "main")]


def arguments(tool) -> list:
    """The tool's arguments (argparse actions), but --help."""
    return [a for a in importlib.import_module(tool).parser()._actions if not isinstance(a, argparse._HelpAction)]


def test_the_tools_are_found():
    assert "fairseq_widearch.cli.stats" in TOOLS and "fairseq_widearch.cli.average_checkpoints" in TOOLS


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_each_tool_answers_help_with_its_whole_usage(tool, flag):
    out = cli(tool, flag)
    assert out.returncode == 0 and out.stdout.startswith("usage: ")
    assert all(option in out.stdout for a in arguments(tool) for option in a.option_strings)


#: The arguments that take any text: a name among the data's or the model's (a subset, checked against
#: --data by ``check_subset``; a language pair and an architecture, checked where they are looked up),
#: the width choices (checked against the model), CTranslate2's weight type (checked by CTranslate2).
FREE_TEXT = {"subset", "lang_pair", "arch", "choices", "quantization"}


@pytest.mark.parametrize("tool", TOOLS)
def test_every_argument_that_takes_a_value_is_checked_by_its_type(tool):
    """Inputs must exist, numbers lie in their range (a bare int or float takes any value)."""
    unchecked = [a.dest for a in arguments(tool)
                 if a.nargs != 0 and not hasattr(a.type, "accepts") and a.dest not in FREE_TEXT]
    assert unchecked == []


ROWS = [(tool, a.option_strings[0] if a.option_strings else None, a.type, value) for tool in TOOLS
        for a in arguments(tool) if hasattr(a.type, "invalid") for value in a.type.invalid]


@pytest.mark.parametrize("tool,flag,kind,value", ROWS,
                         ids=[f"{t.rsplit('.', 1)[1]} {f or 'positional'} {v}" for t, f, _, v in ROWS])
def test_each_checked_argument_refuses_a_wrong_value_in_one_line_naming_it(tool, flag, kind, value):
    """Every value a type refuses (each bound's), given to every argument of that type."""
    out = cli(tool, *([flag] if flag else []), value)
    last = out.stderr.strip().splitlines()[-1]
    named = flag or next(a.dest for a in arguments(tool) if a.type is kind)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"error: argument {named}: takes {kind.accepts}, got {value!r}" in last, last


SUBSET_TOOLS = [tool for tool in TOOLS if any("--subset" in a.option_strings for a in arguments(tool))]


@pytest.mark.parametrize("tool", SUBSET_TOOLS)
def test_a_subset_the_data_lacks_ends_in_one_line_before_any_work(tool, dummy_bin):
    """(any existing file stands for a checkpoint: the split is checked before one is read)"""
    files = [x for a in arguments(tool) if a.required and a.type is existing_file
             for x in (a.option_strings[0], dummy_bin / "dict.en.txt")]
    out = cli(tool, *files, "--data", dummy_bin, "--subset", "nosuch")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].endswith(f"error: argument --subset: {dummy_bin} holds no 'nosuch' split")


# ---- the recipes: every examples/**/*.sh with a shebang (examples/args.sh, sourced by them, has none) ----

SCRIPTS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "examples").rglob("*.sh")
                 if p.read_text().startswith("#!"))


def bash(script, *args, tmp_path):
    """``bash script args`` in a process, with VENV pointing at a directory it must not create."""
    return subprocess.run(["bash", REPO / script, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "VENV": str(tmp_path / "venv")})


def script_help(script, tmp_path) -> str:
    out = bash(script, "--help", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_scripts_are_found():
    assert "examples/multi30k/quickstart.sh" in SCRIPTS and "examples/widenet/wmt14_en_de.sh" in SCRIPTS


def runs_listing() -> list:
    """What the checkout's runs/ holds, two levels deep (where the recipes write by default)."""
    runs = REPO / "runs"
    return sorted([*runs.glob("*"), *runs.glob("*/*")]) if runs.exists() else []


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_each_script_answers_help_with_its_usage_starting_nothing(script, flag, tmp_path):
    before = runs_listing()
    out = bash(script, flag, tmp_path=tmp_path)
    assert runs_listing() == before
    header = (REPO / script).read_text().splitlines()[1].removeprefix("# ")
    assert out.returncode == 0 and out.stdout.startswith(header), (out.stdout[:500], out.stderr[-2000:])
    assert f"bash {script}" in out.stdout or "Sourced by" in out.stdout  # how it is run, what it takes
    assert not (tmp_path / "venv").exists() and list(tmp_path.iterdir()) == []
    fixed = re.search(r'quickstart_as (\S+)', (REPO / script).read_text())
    if fixed:  # a wrapper of the quick start says which option it fixes, and to what
        assert f"but --arch, fixed here to {fixed.group(1)}" in out.stdout


#: What a script's usage calls its arguments -> a value it refuses: an input directory, a number.
WRONG = {"DIR": "/no/such/dir", "N": "-1", "M": "-1", "S": "-1"}


def wrong_arguments(usage: str) -> list:
    """(argument, flags to give) for each checked argument the usage names: ``--data-dir DIR`` (the one
    directory a script reads), ``--x N``/``M``/``S`` (numbers), a leading ``DATA_BIN``."""
    found = [(flag, [flag, WRONG[kind]]) for flag, kind in re.findall(r"\[(--[a-z-]+) (DIR|N|M|S)\b", usage)
             if kind != "DIR" or flag == "--data-dir"]
    if re.search(r"\.sh \[?DATA_BIN", usage):
        found.append(("DATA_BIN", [WRONG["DIR"]]))
    return found


@functools.cache
def usage_of(script) -> str:
    """What ``script --help`` prints (a wrapper's own usage, then the quick start's)."""
    return subprocess.run(["bash", REPO / script, "--help"], capture_output=True, text=True, timeout=60).stdout


ARGUMENTS = [(script, name, given) for script in SCRIPTS for name, given in wrong_arguments(usage_of(script))]


@pytest.mark.parametrize("script,name,given", ARGUMENTS, ids=[f"{s} {n}" for s, n, _ in ARGUMENTS])
def test_each_scripts_wrong_argument_ends_in_one_line_naming_it(script, name, given, tmp_path):
    out = bash(script, *given, tmp_path=tmp_path)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and last.startswith(f"error: argument {name}: takes "), out.stderr[-2000:]
    assert last.endswith(f"got '{given[-1]}'") and "Traceback" not in out.stderr
    assert not (tmp_path / "venv").exists()


def test_every_script_that_takes_an_input_or_a_number_has_rows():
    """The usages the rows are read from name their arguments so: a recipe that reads data has a row."""
    takes = {s for s in SCRIPTS if re.search(r"DATA_BIN|--data-dir|\b[NMS]\]", usage_of(s))}
    assert "examples/widenet/multi30k.sh" in takes and {s for s, _, _ in ARGUMENTS} >= takes


def options(script) -> list:
    """(the options of the script's own ``case`` arms, whether each takes a value: ``shift 2``)."""
    arms = re.findall(r"^\s*(--[a-z0-9-]+(?:\|--[a-z0-9-]+)*)\)(.*?);;", (REPO / script).read_text(), re.M | re.S)
    return [(option, "shift 2" in body) for names, body in arms for option in names.split("|")]


OPTIONS = [(script, option) for script in SCRIPTS for option, valued in options(script) if valued]


@pytest.mark.parametrize("script", [s for s in SCRIPTS if options(s)])
def test_each_scripts_usage_names_every_option_it_takes(script):
    usage = usage_of(script)
    assert [option for option, _ in options(script) if option not in usage] == []


@pytest.mark.parametrize("script,option", OPTIONS, ids=[f"{s} {o}" for s, o in OPTIONS])
def test_an_option_given_without_its_value_ends_in_one_line_naming_it(script, option, tmp_path):
    out = bash(script, option, tmp_path=tmp_path)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and last.startswith(f"error: argument {option}: "), out.stderr[-2000:]
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_scripts_usage_names_the_environment_variables_it_reads(script):
    """A variable the script reads with a default (``${VAR:-...}``: where it writes, which preset)
    is part of what it takes; the allocator's, which only tune speed, are not."""
    text = (REPO / script).read_text()
    own = {name for name, value in re.findall(r"^\s*([A-Z_]+)=(.*)$", text, re.M)
           if not value.startswith(f'"${{{name}:-')}  # set by the script itself (from an option)
    read = set(re.findall(r"\$\{([A-Z_]+):-", text)) - own - {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}
    usage = usage_of(script)
    assert sorted(v for v in read if v not in usage) == []
