"""The documentation site (mkdocs.yml) builds strictly: a broken link or anchor, a page missing from
the navigation or a docstring that does not render fails; and the product speaks of the project, not
of how it is worked on."""
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

#: Words of how the project is worked on. Upstream references keep their form ("upstream issue
#: #4696"); pytest's session scope is not meant.
WORKFLOW_WORDS = re.compile(
    r"(?<!upstream )(?<!upstream issues #5036 and )\bissues? \d+"  # an internal issue number
    r"|\bloans?\b"                                                    # a GPU machine lent
    r"|(?<!scope=\")(?<!scope=')\bsessions?\b(?![-_ ]scope)"          # a period of work
    r"|\bcalls? [12]\b|\b(first|second|both|two) calls\b|\bthe device tool\b", re.IGNORECASE)
#: What the product is made of (docs/data holds measurement records, which are checked too).
SOURCES = ("README.md", "setup.py", "mkdocs.yml", "docs", "fairseq_widearch", "tests", "benchmarks", "examples")
SUFFIXES = {".md", ".py", ".sh", ".yml", ".json", ".jsonl", ".txt"}


def product_files():
    for name in SOURCES:
        path = REPO / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES)
        yield from (f for f in files if "__pycache__" not in f.parts)


def test_the_site_builds_strictly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", tmp_path / "site"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "modules" / "index.html").read_text()
    assert "TopKRouter" in api and "Raises" in api  # the docstrings rendered, sections included


def test_the_strict_build_fails_on_a_broken_anchor(tmp_path):
    """The guard above guards: a copy of the docs with one anchor broken does not build."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", REPO / "docs", docs], check=True)
    index = docs / "index.md"
    index.write_text(index.read_text() + "\n[broken](widenet.md#no-such-heading)\n")
    config = (REPO / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    (tmp_path / "mkdocs.yml").write_text(config)
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", tmp_path / "mkdocs.yml",
                           "--site-dir", tmp_path / "site"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)})
    assert proc.returncode != 0 and "no-such-heading" in proc.stderr


def test_every_page_is_in_the_navigation():
    config = (REPO / "mkdocs.yml").read_text()
    pages = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert {p for p in pages if p not in config} == set()


#: Phrases the guard must flag, put together here so that no file holds them whole (this one is the
#: guard's own and is not scanned), and phrases it must let pass.
FLAGGED = [" ".join(words) for words in (("as", "issue", "56", "asked"), ("the", "fifth", "loan"),
                                         ("in", "the", "next", "session"), ("call", "1", "as", "prepared"))]
PASSED = ["upstream issue #4696", '@pytest.fixture(scope="session")', "once per routing call", "session-scoped fixture"]


@pytest.mark.parametrize("text,found", [(text, True) for text in FLAGGED] + [(text, False) for text in PASSED])
def test_the_words_guard_tells_them_apart(text, found):
    assert bool(WORKFLOW_WORDS.search(text)) == found


def test_no_word_of_how_the_project_is_worked_on():
    this = os.path.abspath(__file__)
    hits = [f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}"
            for path in product_files() if os.path.abspath(path) != this
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
            if WORKFLOW_WORDS.search(line)]
    assert hits == []
