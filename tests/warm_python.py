"""Python programs for the test suite without a fresh interpreter's imports.

A fresh ``fairseq-train`` spends 6-8 s of CPU importing torch, fairseq (scikit-learn with it,
through fairseq's criteria) and torch._dynamo (through torch's optimizers) before its first
update; the suite starts hundreds. :func:`install` replaces ``subprocess.run`` in a pytest worker:
a command that runs a Python program of this environment (fairseq's console scripts,
``python script.py``, ``python -m module``, ``python -c code``) runs as a child forked from one
interpreter that has imported those libraries once, this module run as ``python warm_python.py
SOCKET``. A ``bash`` command (the recipes) finds shims of this environment's ``python`` and
``fairseq-*`` before this environment's bin on its PATH, and in VENV where that names this
environment: they pass such programs to the same interpreter (:func:`shim`), and so does a served
program's own ``subprocess.run``. Every other command, and every ``subprocess.Popen``, runs as
before.

The child becomes the program as a fresh process would: the same argv, environment, working
directory, standard streams (their file descriptors are passed over the socket) and exit status
(negative where a signal ended it, as ``subprocess`` reports it). Only libraries are imported
before the fork: the program's own modules (``fairseq_cli.train``, which configures logging as it
is imported) and the plugin (``--user-dir``) are imported by the child. fairseq's import configures
logging too (``logging.basicConfig`` in two of its tasks); the server records those calls instead of
making them, and the child makes them where a fresh process would: at the program's first import of
fairseq, so that whichever configuration comes first wins, as it does in a fresh process. The
child seeds random, NumPy and torch anew and shuts down as the interpreter does (threads joined,
exit handlers run). What it cannot do as a fresh process does: its string hash seed is the warm
interpreter's (PYTHONHASHSEED is read at start-up), warnings raised by the libraries' imports are
not repeated on its stderr, files it leaves open are not flushed by a final collection, and the
native libraries' own exit (their static destructors) does not run: a test of how a process exits
asks for a fresh one. A command whose environment gives a variable read at import
(``IMPORT_TIME_PREFIXES``) other values than the warm interpreter's runs as a fresh process, and
so does every command when ``WIDEARCH_TEST_FRESH_PROCESSES=1`` (in this process's environment or
the command's)."""
import atexit
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading

BIN = os.path.dirname(sys.executable)
#: Variables the interpreter or the libraries read as they are imported: a command whose environment
#: gives them other values than the warm interpreter's runs fresh (OMP_NUM_THREADS is applied).
IMPORT_TIME_PREFIXES = ("PYTHON", "MKL_", "KMP_", "OMP_", "TORCH", "CUDA_")
#: The environment the warm interpreter starts with: this process's when :func:`install` ran
SERVER_ENV = dict(os.environ)
#: The largest request (argv and environment), in bytes
MAX_REQUEST = 1 << 20


def serves(args, env):
    """Whether ``args`` (strings) runs a Python program the warm interpreter can run in ``env``."""
    if not imports_alike(os.environ if env is None else env):
        return False
    if args[0] == sys.executable:
        return len(args) > 2 and args[1] in ("-m", "-c") or len(args) > 1 and args[1].endswith(".py")
    return os.path.dirname(args[0]) == BIN and os.path.basename(args[0]).startswith("fairseq-")


def imports_alike(env):
    """Whether a process of environment ``env`` imports the libraries as the warm interpreter did:
    the same variables read at import (OMP_NUM_THREADS may differ: the child applies it)."""
    differ = {k for k in {*env, *SERVER_ENV} if k.startswith(IMPORT_TIME_PREFIXES) and env.get(k) != SERVER_ENV.get(k)}
    return not (differ - {"OMP_NUM_THREADS"} or ("OMP_NUM_THREADS" in differ and "OMP_NUM_THREADS" not in env))


def call(path, args, env, cwd, fds, timeout, on_signal=()):
    """Run ``args`` in the warm interpreter listening at ``path``, with standard streams ``fds``,
    the signals ``on_signal`` passed on to it; -> its exit status, or None where the interpreter
    says the environment needs a fresh process."""
    request = json.dumps({"argv": args, "env": dict(os.environ if env is None else env),
                          "cwd": os.fspath(cwd or os.getcwd())}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
        connection.connect(path)
        socket.send_fds(connection, [request], fds)
        reply = connection.recv(64)
        if reply == b"fresh":
            return None
        pid = int(reply)
        for number in on_signal:
            signal.signal(number, lambda number, frame: os.kill(pid, number))
        connection.settimeout(timeout)
        try:
            return int(connection.recv(64))
        except BaseException as e:  # as subprocess.run, the program ends with its caller's wait
            os.kill(pid, signal.SIGKILL)
            connection.settimeout(None)
            connection.recv(64)
            if isinstance(e, socket.timeout):
                raise subprocess.TimeoutExpired(args, timeout) from None
            raise


class Client:
    """The warm interpreter of this process, started at its first command, and a virtualenv of
    shims (``venv``): its ``bin/python`` and ``fairseq-*`` pass their programs to the warm
    interpreter (:func:`shim`), its other commands are this virtualenv's."""

    def __init__(self, served=None):
        """``served``: the directory of a warm interpreter already serving (that of the child's own)."""
        self.dir = served or tempfile.mkdtemp(prefix="warm_python")
        self.socket = os.path.join(self.dir, "socket")
        self.venv, self.shims = os.path.join(self.dir, "venv"), os.path.join(self.dir, "shims")
        if served:
            return
        self.server = subprocess.Popen([sys.executable, __file__, self.socket], stdout=subprocess.PIPE, text=True,
                                       env=SERVER_ENV)
        if self.server.stdout.readline() != "ready\n":
            raise RuntimeError("tests/warm_python.py did not start")
        self.server.stdout.close()
        atexit.register(self.server.kill)
        os.makedirs(os.path.join(self.venv, "bin"))
        os.makedirs(self.shims)
        for name in os.listdir(BIN):
            path, target = os.path.join(self.venv, "bin", name), os.path.join(BIN, name)
            # python3 too: a link to it would not find this virtualenv (no pyvenv.cfg here)
            if name.startswith(("python", "fairseq-")):
                with open(path, "w") as f:  # -S: the shim needs the standard library alone
                    f.write(f"#!{sys.executable} -S\nimport sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                            f"import warm_python\nwarm_python.shim({target!r})\n")
                os.chmod(path, 0o755)
                os.symlink(path, os.path.join(self.shims, name))
            else:
                os.symlink(target, path)

    def bash_env(self, env):
        """``env`` for a bash script: the shims before this virtualenv's bin where PATH has it, and
        in VENV where that names this virtualenv; the shims' socket."""
        env = dict(os.environ if env is None else env)
        if "PATH" in env:
            path = env["PATH"].split(os.pathsep)
            env["PATH"] = os.pathsep.join(d for entry in path for d in ([self.shims, entry] if entry == BIN else [entry]))
        if env.get("VENV") and os.path.realpath(env["VENV"]) == os.path.realpath(sys.prefix):
            env["VENV"] = self.venv
        env["WIDEARCH_WARM_SOCKET"] = self.socket
        return env


def shim(target):
    """The program of ``target`` with this process's arguments, in the warm interpreter that
    ``$WIDEARCH_WARM_SOCKET`` names where it serves it, else ``target`` itself; exits as it exits."""
    args = [target, *sys.argv[1:]]
    code = None
    if os.environ.get("WIDEARCH_TEST_FRESH_PROCESSES") != "1" and "WIDEARCH_WARM_SOCKET" in os.environ \
            and serves(args, None):
        with contextlib.suppress(ConnectionError, FileNotFoundError):  # the warm interpreter has ended
            code = call(os.environ["WIDEARCH_WARM_SOCKET"], args, None, None, [0, 1, 2], None,
                        on_signal=(signal.SIGINT, signal.SIGTERM))
    if code is None:
        os.execv(target, args)
    if code < 0:  # ended by a signal: end by it too (SIGKILL's handler cannot be set, nor need be)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        os._exit(128 - code)  # a signal whose default is to be ignored: the shell's status for it
    os._exit(code)


def install(served=None):
    """Make ``subprocess.run`` run the Python programs it serves in a warm interpreter (see above):
    a new one, or the one serving from directory ``served``."""
    original, client, starting = subprocess.run, [Client(served)] if served else [], threading.Lock()

    def started():
        with starting:  # one warm interpreter, whichever thread calls first
            client[:] = client or [Client()]
        return client[0]

    def run(args, *, stdin=None, input=None, stdout=None, stderr=None, capture_output=False, timeout=None,
            check=False, env=None, cwd=None, text=None, encoding=None, errors=None, universal_newlines=None,
            **other):
        plain = dict(stdin=stdin, input=input, stdout=stdout, stderr=stderr, capture_output=capture_output,
                     timeout=timeout, check=check, env=env, cwd=cwd, text=text, encoding=encoding, errors=errors,
                     universal_newlines=universal_newlines, **other)
        fresh = "1" in (os.environ.get("WIDEARCH_TEST_FRESH_PROCESSES"), (env or {}).get("WIDEARCH_TEST_FRESH_PROCESSES"))
        if isinstance(args, (str, bytes)) or other or fresh:
            return original(args, **plain)
        if not serves([os.fspath(a) for a in args], env):
            if os.path.basename(os.fspath(args[0])) == "bash":  # a recipe: its Python programs through the shims
                plain["env"] = started().bash_env(env)
            return original(args, **plain)
        args = [os.fspath(a) for a in args]
        if capture_output:
            stdout = stderr = subprocess.PIPE
        with tempfile.TemporaryFile() as given, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                open(os.devnull, "r+b") as null:
            if input is not None:
                given.write(input.encode(encoding or "utf-8") if isinstance(input, str) else input)
                given.seek(0)

            def fd(stream, default, pipe):
                if stream is None:
                    return default
                if stream == subprocess.PIPE:
                    return pipe.fileno()
                if stream == subprocess.DEVNULL:
                    return null.fileno()
                return stream if isinstance(stream, int) else stream.fileno()

            fds = [given.fileno() if input is not None else fd(stdin, 0, null), fd(stdout, 1, out)]
            fds.append(fds[1] if stderr == subprocess.STDOUT else fd(stderr, 2, err))
            returncode = call(started().socket, args, env, cwd, fds, timeout)
            if returncode is None:
                return original(args, **plain)
            captured = []
            for stream, pipe in ((stdout, out), (stderr, err)):
                pipe.seek(0)
                data = pipe.read() if stream == subprocess.PIPE else None
                if data is not None and (text or encoding or errors or universal_newlines):
                    data = data.decode(encoding or "utf-8", errors or "strict")
                    if not (encoding or errors):  # universal newlines, as subprocess translates them
                        data = data.replace("\r\n", "\n").replace("\r", "\n")
                captured.append(data)
        proc = subprocess.CompletedProcess(args, returncode, *captured)
        if check:
            proc.check_returncode()
        return proc

    subprocess.run = run


def child(request, fds, logging_calls, served):
    """Become the requested program (standard streams ``fds``), its own ``subprocess.run`` served
    by the warm interpreter of directory ``served``; never returns."""
    import random
    import runpy
    import traceback
    import types

    import numpy as np
    import torch

    code = 1
    configure_logging_at_first_fairseq_import(logging_calls)
    install(served)
    random.seed()  # the generators as a fresh process seeds them, not as the fork left them
    np.random.seed()
    torch.seed()
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))  # as the interpreter opens them
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0 if unbuffered else -1, closefd=False),
                                      write_through=unbuffered)
        sys.stderr = open(2, "w", closefd=False, buffering=1, errors="backslashreplace")
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        if "OMP_NUM_THREADS" in os.environ:  # OpenMP read it when torch was imported here
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        argv = request["argv"]
        if argv[0] == sys.executable and argv[1] == "-m":
            sys.argv, sys.path[0] = argv[2:], os.getcwd()
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        elif argv[0] == sys.executable and argv[1] == "-c":
            sys.argv, sys.path[0] = ["-c", *argv[3:]], ""
            sys.modules["__main__"] = main = types.ModuleType("__main__")
            exec(compile(argv[2], "<string>", "exec"), main.__dict__)
        else:
            script = argv[1] if argv[0] == sys.executable else argv[0]
            sys.argv, sys.path[0] = argv[argv.index(script):], os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:  # as the interpreter reads sys.exit's argument
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:  # the interpreter ends itself by SIGINT then
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
    try:  # the interpreter's shutdown: non-daemon threads joined, then the exit handlers
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def import_recording_logging_calls(*modules):
    """Import ``modules`` with ``logging.basicConfig`` recorded, not made; -> the calls' keywords."""
    import importlib
    import logging

    calls, basic_config = [], logging.basicConfig
    logging.basicConfig = lambda **kwargs: calls.append(kwargs)
    try:
        for module in modules:
            importlib.import_module(module)
    finally:
        logging.basicConfig = basic_config
    return calls


def configure_logging_at_first_fairseq_import(calls):
    """Make the recorded ``logging.basicConfig`` ``calls`` when the program first imports fairseq."""
    import builtins
    import logging

    original = builtins.__import__

    def first_import(name, *args, **kwargs):
        if name == "fairseq" or name.startswith("fairseq."):
            builtins.__import__ = original
            for call in calls:
                logging.basicConfig(**call)
        return original(name, *args, **kwargs)

    builtins.__import__ = first_import


def serve(path):
    """Import the libraries, then serve requests, each at once: a forked waiter forks the program,
    reports its pid and waits for its exit status. Ends when the process that started it ends."""
    # torch._dynamo: torch.optim imports it at the first optimizer; fairseq: its tasks and criteria,
    # scikit-learn among them
    logging_calls = import_recording_logging_calls("torch", "torch._dynamo", "fairseq", "fairseq.checkpoint_utils",
                                                   "fairseq.sequence_generator", "fairseq.trainer")

    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen()
    server.settimeout(5)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters are reaped without waiting for them
    print("ready", flush=True)
    while os.getppid() == parent:
        try:
            connection, _ = server.accept()
        except socket.timeout:
            continue
        message, fds, _, _ = socket.recv_fds(connection, MAX_REQUEST, 3)
        if os.fork() == 0:  # the waiter
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            if not imports_alike(json.loads(message)["env"]):
                connection.send(b"fresh")
                os._exit(0)
            pid = os.fork()
            if pid == 0:
                connection.close()
                child(json.loads(message), fds, logging_calls, os.path.dirname(path))
            for fd in fds:
                os.close(fd)
            connection.send(str(pid).encode())
            _, status = os.waitpid(pid, 0)
            connection.send(str(os.waitstatus_to_exitcode(status)).encode())
            os._exit(0)
        for fd in fds:
            os.close(fd)
        connection.close()


if __name__ == "__main__":
    serve(sys.argv[1])
