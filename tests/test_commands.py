"""Every command the manual shows runs as written: each ``fairseq-train``, ``fairseq-generate``,
``fairseq-interactive``, ``fairseq-preprocess``, ``python -m fairseq_widearch...``, ``python
examples/...``, ``python benchmarks/...`` and ``bash examples/...`` invocation in README.md, docs/**/*.md and examples/**/*.sh
is extracted (line continuations joined, shell variables given test values) and parsed by the parser
that will read it: fairseq's own, with the plugin's architectures, tasks and criteria registered as
``--user-dir`` registers them (the keys of ``--model-overrides`` checked against the plugin's model
configs); argparse for the plugin's tools and the examples' Python scripts; the option list of an
example's shell wrapper, following it into the script it hands its options to. A file the command
names inside the tree must exist."""
import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import re
import shlex
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
from fairseq import options
from fairseq.models.transformer import TransformerConfig

import figures
from testing_utils import PLUGIN_MODELS, REPO

pytestmark = pytest.mark.docs

FAIRSEQ_TOOLS = {"fairseq-train": options.get_training_parser, "fairseq-generate": options.get_generation_parser,
                 "fairseq-interactive": options.get_interactive_generation_parser,
                 "fairseq-preprocess": options.get_preprocessing_parser}
#: What a shell variable or a placeholder of the manual stands for, where the value matters to a parser.
TEST_VALUES = {"ARCH": "latent_depth_transformer_lld_12_24", "p": "lld_12_24", "seed": "1", "width": "128",
               "ROOT": str(REPO), "HERE": str(REPO / "examples"), "CRITERION": "label_smoothed_cross_entropy",
               "PY": "python", "VENV": ".venv"}
#: What an unknown variable expands to: a word every parser takes (a path, a count, a rate).
PLACEHOLDER = "1"
SHELL_WORDS = {"do", "then", "else", "exec", "time", "nohup", "env"}


@dataclasses.dataclass
class Command:
    source: str  # file:line
    argv: List[str]  # the program first
    env: Dict[str, str] = dataclasses.field(default_factory=dict)  # VAR=value given before it

    def __str__(self):
        return f"{self.source}: {shlex.join(self.argv)}"


# --- extraction ---
def joined_lines(text: str) -> List[Tuple[int, str]]:
    """(first line number, logical line) with backslash continuations joined."""
    out, buffer, start = [], "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not buffer:
            start = number
        if line.rstrip().endswith("\\"):
            buffer += line.rstrip()[:-1] + " "
            continue
        out.append((start, buffer + line))
        buffer = ""
    return out


def markdown_code(text: str) -> Iterator[Tuple[int, str, bool]]:
    """(line number, code, inline) of every fenced shell block's logical lines and of every inline
    code span."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = None if fence is not None else (line.strip()[3:] or "sh")
            if fence is not None:
                block, first = [], number + 1
            else:
                yield from ((first + n - 1, code, False) for n, code in joined_lines("\n".join(block)))
            continue
        if fence is not None:
            if fence in ("bash", "sh", "shell", "console"):
                block.append(line)
            continue
        for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", line):
            yield number, span, True


class Shell:
    """The values of a script's variables and arrays as it assigns them, in order (the last assignment
    wins; ``${X:-default}`` gives its default), enough to expand the commands it runs."""

    def __init__(self):
        self.values: Dict[str, str] = dict(TEST_VALUES)
        self.arrays: Dict[str, List[str]] = {}

    def expand(self, text: str) -> str:
        text = re.sub(r'"?\$\{(\w+)\[@\]\}"?', lambda m: shlex.join(self.arrays.get(m.group(1), [])), text)
        text = re.sub(r'"\$@"|\$@|"\$\*"', "", text)
        text = re.sub(r"\$\((?:[^()]|\([^()]*\))*\)", "1", text)  # a command substitution: its output unknown
        text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: self.values.get(m.group(1), m.group(2)), text)
        text = re.sub(r"\$\{(\w+):\+([^}]*)\}", lambda m: m.group(2) if m.group(1) in self.values else "", text)
        text = re.sub(r"\$\{(\w+)[^}]*\}", lambda m: self.values.get(m.group(1), PLACEHOLDER), text)
        return re.sub(r"\$(\w+)", lambda m: self.values.get(m.group(1), PLACEHOLDER), text)

    def assign(self, line: str) -> bool:
        """Record ``NAME=value`` or ``NAME=(...)``; whether ``line`` was one."""
        if re.match(r"(local|declare|export)\s+\w+=\S*\s+\w+=", line):  # several at once: `local a=$1 b=$2`
            return all(self.assign(part) for part in line.split()[1:])
        match = re.fullmatch(r"\s*(?:export\s+|local\s+)?(\w+)(\+?)=(.*)", line)
        if not match or " " in match.group(1):
            return False
        name, append, value = match.groups()
        if not value.startswith(("(", "$(", "`")) and len(words(value)) > 1:  # `VAR=value program ...`
            return False
        if name in TEST_VALUES and "$(" in value:  # computed at run time: the test's value stands
            return True
        if re.search(r"\$\{?[0-9]", value):  # an option's value (`--arch) ARCH="$2"`): the default stands
            return True
        if value.startswith("("):
            items = words(self.expand(value.strip()[1:-1]))
            self.arrays[name] = (self.arrays.get(name, []) if append else []) + items
        else:
            self.values[name] = " ".join(words(self.expand(value)))  # word-split where expanded unquoted
        return True


def words(text: str) -> List[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return []


def segments(tokens: List[str]) -> Iterator[List[str]]:
    """The simple commands of a tokenised line: split at ; | && || and ( ), shell keywords dropped."""
    current: List[str] = []
    tokens = [t for i, t in enumerate(tokens) if not (re.fullmatch(r"[<>]+&?|\d?>+&?\d?", t) or i and
                                                       re.fullmatch(r"\d?[<>]+&?", tokens[i - 1]))]  # redirections
    for token in tokens + [";"]:
        if token in (";", "|", "&&", "||", "&", "(", ")", ";;", "|&"):
            while current and (current[0] in SHELL_WORDS or current[0].startswith("-") is False
                               and re.fullmatch(r"\w+=.*", current[0])):
                current = current[1:]
            if current:
                yield current
            current = []
        else:
            current.append(token)


def program(argv: List[str]) -> Optional[List[str]]:
    """``argv`` from the program on if it runs one of the commands this test parses, else None."""
    for i, token in enumerate(argv):
        name = token.rsplit("/", 1)[-1]
        if name in FAIRSEQ_TOOLS or name == "torchrun":
            return [name, *argv[i + 1:]]
        if re.fullmatch(r"python[\d.]*", name) and len(argv) > i + 1:
            rest = argv[i + 1:]
            if rest[0] == "-m" and len(rest) > 1 and rest[1].startswith("fairseq_widearch"):
                return ["-m", *rest[1:]]
            tree = re.search(r"(?:^|/)((?:examples|benchmarks)/\S+\.py)$", rest[0])
            if tree:
                return ["script", tree.group(1), *rest[1:]]
            return None
        if name == "bash" and len(argv) > i + 1 and "examples/" in argv[i + 1]:
            return ["bash", argv[i + 1].split("examples/", 1)[1], *argv[i + 2:]]
        if i == 0 and not re.fullmatch(r"\w+=.*", token):
            return None
    return None


def commands_of(source: str, lines, shell: Optional[Shell] = None) -> Iterator[Command]:
    """The commands this test parses among ``lines`` ((number, code, inline)). An inline code span
    counts only as a whole command: with an argument, and none of its words a placeholder
    (``<name>``, ``N``, ``...``), since prose names programs and flags in passing; ``[optional]``
    brackets are dropped, and so are a fenced command's ``...``."""
    shell = shell or Shell()
    for number, line, inline in lines:
        stripped = line.strip()
        if stripped.startswith("$ "):
            stripped = stripped[2:]
        if re.search(r"<[\w .|-]+>", stripped):  # a placeholder: a pattern of commands, not one
            continue
        for name, items in re.findall(r"\bfor (\w+) in ([^;]+);", stripped):
            shell.values[name] = (words(shell.expand(items)) or [PLACEHOLDER])[0]
        for statement in statements(stripped):
            if not shell.assign(statement):
                yield from statement_commands(source, number, statement, shell, inline)


def statement_commands(source: str, number: int, statement: str, shell: Shell, inline: bool) -> Iterator[Command]:
    """The commands to parse in one shell statement (see :func:`commands_of`)."""
    for argv in segments(words_with_operators(shell.expand(statement))):
        argv = [t.strip("[]") for t in argv if t not in ("...", "[...]")]
        found = program(argv)
        if not found or "<" in "".join(found) or inline and not inline_command(found):
            continue
        if inline and found[0] in FAIRSEQ_TOOLS:  # prose names flags of a command, leaving out the rest
            if not any(not t.startswith("-") for t in found[1:2]):
                found.insert(1, PLACEHOLDER)
            if found[0] == "fairseq-train" and "--arch" not in found:
                found += ["--arch", "transformer"]
        prefix = argv[:argv.index(next(t for t in argv if not re.fullmatch(r"\w+=\S*", t)))]
        yield Command(f"{source}:{number}", found, dict(t.split("=", 1) for t in prefix))


def statements(line: str) -> List[str]:
    """``line`` split at the ``;`` outside quotes and ``$( )``: ``DATA="$1"; shift`` is two statements."""
    parts, current, quote, depth = [], "", None, 0
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif line.startswith("$(", i):
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif char == ";" and not depth and not line.startswith(";;", i) and not line.startswith(";", i - 1 if i else 0) \
                and line[i + 1:i + 2] != ";":
            parts.append(current)
            current = ""
            continue
        current += char
    return [p.strip() for p in parts + [current] if p.strip()]


def inline_command(argv: List[str]) -> bool:
    """Whether an inline code span is a command to parse rather than a mention of a program: it
    gives arguments, none of them a placeholder (``{a,b}``, a lone capital)."""
    return len(argv) > (2 if argv[0] in ("-m", "script", "bash") else 1) and not any(
        re.search(r"\{.*,.*\}|^[A-Z]$", t) for t in argv)


def words_with_operators(text: str) -> List[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        return list(lexer)
    except ValueError:
        return []


def manual_commands() -> List[Command]:
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        found += commands_of(str(path.relative_to(REPO)), markdown_code(path.read_text()))
    for path in sorted((REPO / "examples").rglob("*.sh")):
        found += commands_of(str(path.relative_to(REPO)), ((n, line, False) for n, line in joined_lines(path.read_text())))
    return found


# --- the parsers ---
class Parsed(Exception):
    """Raised in place of running a tool once its arguments parsed."""


@contextlib.contextmanager
def parse_only():
    """argparse parses as usual; a successful ``parse_args`` raises :class:`Parsed` instead of returning."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        result = original(self, args, namespace)
        raise Parsed(result)

    argparse.ArgumentParser.parse_args = parse_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def argparse_error(call) -> Optional[str]:
    """Run ``call`` under :func:`parse_only`: None if its arguments parsed, else argparse's message."""
    err = io.StringIO()
    with parse_only(), contextlib.redirect_stderr(err):
        try:
            call()
        except Parsed:
            return None
        except SystemExit as e:
            if e.code == 0:  # --help printed
                return None
            last = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
            # an input (or an output's directory) the manual names but this checkout lacks: the reader's run
            return None if re.search(r": takes (an existing (file|directory)|a path in an existing directory|"
                                     r"LABEL=CKPT, CKPT an existing)", last) else last
    return "the tool ran without parsing any arguments"


MODEL_FIELDS = {f.name for cls in PLUGIN_MODELS for f in dataclasses.fields(cls.config)} | {
    f.name for f in dataclasses.fields(TransformerConfig)}


def fairseq_error(tool: str, argv: List[str]) -> Optional[str]:
    def call():
        parser = FAIRSEQ_TOOLS[tool]()
        if tool == "fairseq-preprocess":
            parser.parse_args(argv)
        try:
            args = options.parse_args_and_arch(parser, argv)
        except RuntimeError:  # fairseq's own, bare, for an --arch it does not know or none
            print("error: no registered --arch", file=sys.stderr)
            raise SystemExit(2)
        raise Parsed(args)

    error = argparse_error(call)
    if error or "--model-overrides" not in argv:
        return error
    overrides = eval(argv[argv.index("--model-overrides") + 1])  # fairseq evals it too
    unknown = sorted(set(overrides) - MODEL_FIELDS)
    return f"--model-overrides keys that no model has: {unknown}" if unknown else None


def wrapper_options(script: Path) -> Tuple[set, Optional[str]]:
    """(the options a wrapper's ``case`` accepts, the example script it hands ``"$@"`` to or None)."""
    text = script.read_text()
    accepted = {o for pattern in re.findall(r"^\s*([-\w|]+)\)", text, re.M) for o in pattern.split("|")
                if o.startswith("-")}
    target = re.search(r'exec bash "\$ROOT/examples/([\w/]+\.sh)"|(quickstart_as) ', text)
    return accepted, (target.group(1) or "multi30k/quickstart.sh") if target else None


def wrapper_error(relative: str, argv: List[str], fixed: Tuple[str, ...] = ()) -> Optional[str]:
    """Check ``bash examples/<relative> argv``: its options, then those it hands on, then (for the
    quick start) the fairseq-train flags after ``--`` with its arch."""
    script = REPO / "examples" / relative
    if not script.exists():
        return f"examples/{relative} does not exist"
    accepted, target = wrapper_options(script)
    if target and not accepted:  # a thin wrapper: its arguments go to the target with its own
        text = "\n".join(line for _, line in joined_lines(script.read_text()))
        fixed_args = re.search(r'exec bash "\$ROOT/examples/[\w/]+\.sh" (.*)', text)
        fixed_args = fixed_args.group(1) if fixed_args else \
            "--arch {} \"$@\"".format(re.search(r'quickstart_as (\S+) ', text).group(1))  # examples/args.sh
        handed = words(fixed_args.replace('"$@"', shlex.join(argv)))
        return wrapper_error(target, handed)
    options_part, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    for i, token in enumerate(options_part):
        if token.startswith("-") and token not in accepted and token not in ("-h", "--help"):
            if i == 0 or options_part[i - 1] not in accepted:
                return f"examples/{relative} does not take {token}"
    if extra and relative == "multi30k/quickstart.sh":
        arch = options_part[options_part.index("--arch") + 1] if "--arch" in options_part else "multipath_transformer_multi30k"
        return fairseq_error("fairseq-train", [PLACEHOLDER, "--arch", arch, *extra])
    return None


def missing_files(argv: List[str]) -> List[str]:
    return [t for t in argv if re.fullmatch(r"(examples|docs|benchmarks|fairseq_widearch)/[\w./-]+\.(py|sh|md)", t)
            and not (REPO / t).exists()]


#: What torchrun starts, by module: the fairseq tool whose parser reads the rest.
TORCHRUN_MODULES = {"fairseq_cli.train": "fairseq-train", "fairseq_cli.generate": "fairseq-generate"}


def torchrun_error(argv: List[str]) -> Optional[str]:
    """torchrun's own options by its parser, then the module's by the fairseq tool's."""
    from torch.distributed.run import get_args_parser
    error = argparse_error(lambda: get_args_parser().parse_args(argv))
    if error:
        return error
    args = get_args_parser().parse_args(argv)
    if not args.module or args.training_script not in TORCHRUN_MODULES:
        return f"torchrun starts {args.training_script}, not one of {sorted(TORCHRUN_MODULES)} with -m"
    return fairseq_error(TORCHRUN_MODULES[args.training_script], args.training_script_args)


def error_of(command: Command) -> Optional[str]:
    kind, *rest = command.argv
    missing = missing_files(rest)
    if missing:
        return f"names files the tree does not have: {missing}"
    if kind in FAIRSEQ_TOOLS:
        return fairseq_error(kind, rest)
    if kind == "torchrun":
        return torchrun_error(rest)
    if kind == "-m":
        module = importlib.import_module(rest[0])
        return argparse_error(lambda: module.main(rest[1:]))
    if kind == "script":
        if not (REPO / rest[0]).exists():
            return f"{rest[0]} does not exist"
        return argparse_error(lambda: figures.script(rest[0]).main(rest[1:]))
    return wrapper_error(rest[0], rest[1:])


COMMANDS = manual_commands()


def test_the_manual_has_commands_of_every_kind():
    kinds = {c.argv[0] for c in COMMANDS}
    assert {"fairseq-train", "fairseq-generate", "fairseq-preprocess", "-m", "script", "bash", "torchrun"} <= kinds, kinds
    assert len(COMMANDS) > 60


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_command_of_the_manual_parses(command):
    assert error_of(command) is None, str(command)


QUICK_START_WRAPPERS = sorted(str(p.relative_to(REPO / "examples")) for p in (REPO / "examples").rglob("*.sh")
                              if re.search(r"^quickstart_as ", p.read_text(), re.M))


@pytest.mark.parametrize("wrapper", QUICK_START_WRAPPERS)
def test_every_quick_start_wrapper_hands_fairseq_train_flags_on_as_readme_says(wrapper):
    """README: ``-- FLAGS`` passes flags to fairseq-train, through every architecture's wrapper too."""
    assert wrapper_error(wrapper, ["--updates", "10", "--", "--seed", "2"]) is None
    assert "--bogus" in wrapper_error(wrapper, ["--", "--seed", "2", "--bogus"])
