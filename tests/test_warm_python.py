"""The suite's launcher (tests/warm_python.py): a Python program run by a forked warm interpreter
sees what a fresh process sees, and its caller gets what ``subprocess.run`` gives."""
import os
import re
import subprocess
import sys

import pytest

import conftest
import warm_python

PROGRAM = """
import logging, os, random, sys
print(sys.argv[1:], os.getcwd(), os.environ.get("PROBE"), sys.stdin.read(), logging.root.handlers,
      sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
print("to stderr", random.random(), file=sys.stderr)
sys.exit(int(os.environ.get("EXIT", "0")))
"""

#: The variables read at import, which a command's environment keeps to be served warm
PYTHON_VARIABLES = {k: v for k, v in os.environ.items() if k.startswith(warm_python.IMPORT_TIME_PREFIXES)}


def both(monkeypatch, *args, **kwargs):
    """``subprocess.run(*args, **kwargs)`` warm, then fresh: their (exit status, stdout, stderr)."""
    results = []
    for fresh in ("0", "1"):
        monkeypatch.setenv("WIDEARCH_TEST_FRESH_PROCESSES", fresh)
        proc = subprocess.run(*args, **kwargs)
        results.append((proc.returncode, proc.stdout, proc.stderr))
    return results


def test_a_warm_child_runs_a_script_as_a_fresh_process_does(tmp_path, monkeypatch):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    (tmp_path / "work").mkdir()
    env = {"PROBE": "seen", "EXIT": "3", "PATH": "/usr/bin", **PYTHON_VARIABLES}
    assert warm_python.serves([sys.executable, str(script)], env)
    flags = dict(cwd=tmp_path / "work", input="given", capture_output=True, text=True, env=env)
    (warm, fresh), (again, _) = (both(monkeypatch, [sys.executable, script, "a", "--b"], **flags) for _ in range(2))
    assert warm[:2] == fresh[:2] == again[:2] == (3, f"['a', '--b'] {tmp_path / 'work'} seen given [] True\n")
    assert warm[2].startswith("to stderr ")
    assert warm[2] != again[2]  # random's state seeded anew, not copied from the warm interpreter


def test_a_warm_child_writes_to_the_callers_files_and_reports_signals_and_timeouts(tmp_path, monkeypatch):
    script = tmp_path / "program.py"
    script.write_text("import os, signal, sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.stdout.flush()\n"
                      "os.kill(os.getpid(), signal.SIGKILL)\n")
    logs = []
    for fresh in ("0", "1"):
        monkeypatch.setenv("WIDEARCH_TEST_FRESH_PROCESSES", fresh)
        with open(tmp_path / f"log{fresh}", "w") as log:
            assert subprocess.run([sys.executable, script], stdout=log, stderr=subprocess.STDOUT).returncode == -9
        logs.append((tmp_path / f"log{fresh}").read_text())
    assert logs[0] == logs[1] == "out\nerr\n"
    monkeypatch.setenv("WIDEARCH_TEST_FRESH_PROCESSES", "0")
    script.write_text("import signal\nsignal.pause()\n")
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, script], timeout=1)
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run([sys.executable, "-m", "fairseq_widearch.cli.prune_latent_layers"], capture_output=True,
                       check=True)


def test_commands_it_cannot_run_as_a_fresh_process_would_run_fresh():
    assert warm_python.serves([sys.executable, "-c", "pass"], None)
    assert not warm_python.serves([sys.executable, "-c"], None) and not warm_python.serves([sys.executable], None)
    assert not warm_python.serves(["bash", "x.sh"], None)
    assert not warm_python.serves([sys.executable, "x.py"], {**PYTHON_VARIABLES, "PYTHONPATH": "/elsewhere"})


@pytest.mark.parametrize("first", ["program", "fairseq"])
def test_a_warm_childs_logging_is_configured_by_whichever_comes_first_as_in_a_fresh_process(
        tmp_path, monkeypatch, first):
    """fairseq configures logging as it is imported (stderr, as its tasks do); fairseq-train configures
    it before importing fairseq (stdout), fairseq-generate after: the same streams either way."""
    configure = "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='%(message)s')"
    order = [configure, "import fairseq"] if first == "program" else ["import fairseq", configure]
    script = tmp_path / "program.py"
    script.write_text("\n".join(["import logging, sys", *order, "logging.getLogger('probe').info('logged here')"]))
    streams = [("logged here" in out, "logged here" in err)
               for _, out, err in both(monkeypatch, [sys.executable, script], capture_output=True, text=True)]
    assert streams[0] == streams[1] == ((True, False) if first == "program" else (False, True))


def test_a_warm_child_is_forked_seeded_anew_and_shuts_down_as_the_interpreter_does(tmp_path, monkeypatch):
    """Served warm (its parent is not this process), yet torch seeded anew each time; a thread the
    program leaves running finishes, text output has universal newlines and an uncaught
    KeyboardInterrupt ends it by SIGINT, as in a fresh process."""
    script = tmp_path / "program.py"
    script.write_text("import os, sys, threading, torch\n"
                      "threading.Thread(target=lambda: (threading.main_thread().join(), print('joined'))).start()\n"
                      "print(os.getppid() == int(sys.argv[1]), torch.initial_seed(), end='\\r\\n')\n"
                      "sys.stdout.write('a\\rb\\n')\n"
                      "if len(sys.argv) > 2: raise KeyboardInterrupt\n")
    command = [sys.executable, script, str(os.getpid())]
    runs = [*both(monkeypatch, command, capture_output=True, text=True),
            *both(monkeypatch, command, capture_output=True, text=True)]
    lines = [out.splitlines() for _, out, _ in runs]
    assert [line[0].split()[0] for line in lines] == ["False", "True", "False", "True"]
    assert lines[0][0] != lines[2][0]  # torch's seed
    assert all(line[1:] == ["a", "b", "joined"] for line in lines)
    assert [code for code, _, _ in both(monkeypatch, [*command, "interrupt"], capture_output=True)] == [-2, -2]


def test_a_variable_a_library_sets_for_good_in_a_test_is_undone_after_it():
    """conftest's ``pytest_runtest_protocol`` around a test that sets an import-time variable, as
    fairseq's data loader sets PYTHONWARNINGS: afterwards the warm interpreter still serves."""
    before = os.environ.get("PYTHONWARNINGS")
    protocol = conftest.pytest_runtest_protocol(item=None, nextitem=None)
    next(protocol)
    os.environ["PYTHONWARNINGS"] = "ignore:semaphore_tracker:UserWarning"
    assert not warm_python.serves([sys.executable, "program.py"], None)
    with pytest.raises(StopIteration):
        next(protocol)
    assert os.environ.get("PYTHONWARNINGS") == before and warm_python.serves([sys.executable, "program.py"], None)


def test_a_bash_scripts_python_programs_are_served_warm_and_exit_as_they_would_fresh(tmp_path, monkeypatch):
    """bash finds the shims before this environment's bin on PATH and in VENV: python (``-c``, a
    script) and fairseq's commands run warm (the program's parent is not the shell), with the
    shell's streams, working directory and exit statuses, a signal's included."""
    (tmp_path / "program.py").write_text("import os, sys\nprint(os.getppid(), sys.argv[1:], os.getcwd())\n"
                                         "sys.exit(int(sys.argv[1]))\n")
    script = ('echo $$; python program.py 0 a; "$VENV/bin/python" -c "import os, sys; print(os.getppid(), sys.argv[1:])" b; '
              'python program.py 4 || echo "exit $?"; python -c "import os; os.kill(os.getpid(), 9)" || echo "exit $?"; '
              'fairseq-train --help > /dev/null && echo trained')
    env = {**os.environ, "VENV": sys.prefix, "PATH": os.pathsep.join([warm_python.BIN, os.environ["PATH"]])}
    (warm, warm_out, _), (fresh, fresh_out, _) = both(monkeypatch, ["bash", "-c", script], cwd=tmp_path, env=env,
                                                    capture_output=True, text=True)
    shell, *lines = warm_out.splitlines()
    parents = [line.split()[0] for line in lines[:3]]
    assert warm == fresh == 0 and all(parent != shell for parent in parents)
    without_parents = lambda out: [re.sub(r"^\d+ ", "", line) for line in out.splitlines()[1:]]
    assert without_parents(warm_out) == without_parents(fresh_out) == [
        f"['0', 'a'] {tmp_path}", "['b']", f"['4'] {tmp_path}", "exit 4", "exit 137", "trained"]


def test_a_served_programs_own_python_commands_are_served_too(tmp_path, monkeypatch):
    script = tmp_path / "program.py"
    script.write_text("import os, subprocess, sys\n"
                      "out = subprocess.run([sys.executable, '-c', 'import os; print(os.getppid())'], capture_output=True,"
                      " text=True).stdout\nprint(int(out) == os.getpid())\n")
    assert [out for _, out, _ in both(monkeypatch, [sys.executable, script], capture_output=True, text=True)] == [
        "False\n", "True\n"]
