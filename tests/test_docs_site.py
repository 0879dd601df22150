"""The documentation site (mkdocs.yml) builds strictly: a broken link or anchor, a page missing from
the navigation or a docstring that does not render fails; and the product speaks of the project, not
of how it is worked on."""
import os
import re
import subprocess
import sys

import pytest

import mkdocs_hooks
from testing_utils import REPO

pytestmark = pytest.mark.docs

#: Words of how the project is worked on: an internal issue number ("issue #56", "issues 12"), a GPU
#: machine lent, a period of work, the time a machine is lent for. Upstream references keep their form
#: ("upstream issue #4696", "upstream issues #5036 and #5351": matched with their "upstream" and let
#: pass, see :func:`workflow_words`); pytest's session scope and object are not meant.
WORKFLOW_WORDS = re.compile(
    r"(?P<upstream>\bupstream\s+)?\bissues?\s+#?\d+"                # an issue number, upstream or not
    r"|\bloans?\b"                                                    # a GPU machine lent
    r"|(?<!scope=\")(?<!scope=')(?<!\.)\bsessions?\b(?![-_ ]scope)"   # a period of work
    r"|\bdevice\s+time\b|\bthe\s+device\s+tool\b", re.IGNORECASE)     # the machine's allowance, its tool


def workflow_words(text):
    """(line number, phrase) of every word of how the project is worked on in ``text``, upstream issue
    numbers left out; the whole text is searched, so a phrase broken over two lines is found too."""
    return [(text.count("\n", 0, m.start()) + 1, " ".join(m.group(0).split()))
            for m in WORKFLOW_WORDS.finditer(text) if not m.group("upstream")]


#: What the product is made of (docs/data holds measurement records, which are checked too).
SOURCES = ("README.md", "setup.py", "mkdocs.yml", "docs", "fairseq_widearch", "tests", "benchmarks", "examples")
SUFFIXES = {".md", ".py", ".sh", ".yml", ".json", ".jsonl", ".txt"}


def product_files():
    for name in SOURCES:
        path = REPO / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES)
        yield from (f for f in files if "__pycache__" not in f.parts)


@pytest.mark.e2e
def test_the_site_builds_strictly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", tmp_path / "site"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "modules" / "index.html").read_text()
    assert "TopKRouter" in api and "Raises" in api  # the docstrings rendered, sections included
    # README's quick start and own-data path, included in the site with their links made the site's
    quickstart = (tmp_path / "site" / "quickstart" / "index.html").read_text()
    assert "examples/multi30k/quickstart.sh" in quickstart and "learn-bpe" in quickstart
    assert 'href="../widenet/#usage"' in quickstart and "README.md" not in quickstart
    # the pages' links to README's own-data section (GitHub's) lead to the site's quick-start page
    widenet = (tmp_path / "site" / "widenet" / "index.html").read_text()
    assert 'href="../quickstart/#train-on-your-own-data"' in widenet and "README.md" not in widenet


def test_the_pages_link_readmes_sections_where_github_shows_them():
    """The site's quick-start page exists only in the site (mkdocs_hooks.py generates it), so a page
    links README's section itself, as GitHub shows it (the site rewrites the link); every such
    anchor is a heading of README, and no page links the quick-start page."""
    readme = (REPO / "README.md").read_text()
    headings = {h.lower().replace(" ", "-") for h in re.findall(r"^#+ (.+)$", readme, re.M)}
    links = {(page.name, anchor) for page in (REPO / "docs").glob("*.md")
             for anchor in re.findall(r"\]\(\.\./README\.md#([\w-]+)\)", page.read_text())}
    assert ("widenet.md", "train-on-your-own-data") in links and ("index.md", "quick-start") in links
    assert all(anchor in headings for _, anchor in links), links - {(p, a) for p, a in links if a in headings}
    assert not (REPO / "docs" / "quickstart.md").exists()
    assert not [page.name for page in (REPO / "docs").glob("*.md") if "quickstart.md" in page.read_text()]


#: Sphinx markup, which the site's renderer (mkdocstrings, Markdown) prints as it stands.
SPHINX_MARKUP = re.compile(r":(data|func|class|mod|meth|attr|obj|exc):`|\w::$", re.M)


@pytest.mark.parametrize("text,found", [(":data:`MULTI30K_SCHEDULE`", True), ("fuses them::", True),
                                        ("``MULTI30K_SCHEDULE``", False), ("x[::2]", False)])
def test_the_sphinx_guard_tells_them_apart(text, found):
    assert bool(SPHINX_MARKUP.search(text)) == found


def test_no_docstring_of_the_package_uses_sphinx_markup():
    hits = [f"{path.relative_to(REPO)}:{n}" for path in sorted((REPO / "fairseq_widearch").rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if SPHINX_MARKUP.search(line)]
    assert hits == []


@pytest.mark.e2e
def test_the_strict_build_fails_on_a_broken_anchor(tmp_path):
    """The guard above guards: a copy of the docs with one anchor broken does not build."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", REPO / "docs", docs], check=True)
    index = docs / "index.md"
    index.write_text(index.read_text() + "\n[broken](widenet.md#no-such-heading)\n")
    config = (REPO / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    config = config.replace("- mkdocs_hooks.py", f"- {REPO / 'mkdocs_hooks.py'}")
    (tmp_path / "mkdocs.yml").write_text(config)
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", tmp_path / "mkdocs.yml",
                           "--site-dir", tmp_path / "site"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)})
    assert proc.returncode != 0 and "no-such-heading" in proc.stderr


def test_every_page_is_in_the_navigation():
    """Listed in mkdocs.yml, or an architecture page, which the hook lists."""
    config = (REPO / "mkdocs.yml").read_text()
    pages = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert len(mkdocs_hooks.architecture_pages()) >= 5
    assert {p for p in pages if p not in config} - set(mkdocs_hooks.architecture_pages()) == set()


#: Phrases the guard must flag, put together here so that no file holds them whole (this one is the
#: guard's own and is not scanned), and phrases it must let pass.
FLAGGED = [" ".join(words) for words in (
    ("as", "issue", "56", "asked"), ("as", "issue", "#56", "asked"), ("see", "issues", "#56", "and", "#57"),
    ("the", "fifth", "loan"), ("in", "the", "next", "session"), ("811", "s", "of", "device", "time"),
    ("no", "device\ntime", "was", "left"), ("ask", "the", "device", "tool"))]
PASSED = ["upstream issue #4696", "upstream\nissue #4696", "upstream issues #5036 and #5351",
          '@pytest.fixture(scope="session")', "session-scoped fixture", "request.session.shouldstop = message",
          "once per routing call", "two calls",
          "call 1 of the router", "the first calls", "both calls", "9.7 ms of GPU time per step"]


@pytest.mark.parametrize("text,found", [(text, True) for text in FLAGGED] + [(text, False) for text in PASSED])
def test_the_words_guard_tells_them_apart(text, found):
    assert bool(workflow_words(text)) == found


def test_no_word_of_how_the_project_is_worked_on():
    this = os.path.abspath(__file__)
    hits = []
    for path in product_files():
        if os.path.abspath(path) != this:
            text = path.read_text(errors="replace")
            lines = text.split("\n")
            hits += [f"{path.relative_to(REPO)}:{n}: {phrase!r} in {lines[n - 1].strip()[:100]}"
                     for n, phrase in workflow_words(text)]
    assert hits == []


