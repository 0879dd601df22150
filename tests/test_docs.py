"""The documentation covers every flag the plugin adds and shows each figure as its committed row has
it; each page keeps within its budget and speaks in the present tense. Marked ``docs``: a failing
page is told apart from failing code (``pytest -m docs``)."""
import dataclasses
import re

import pytest
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
from fairseq.dataclass import FairseqDataclass
from fairseq.models import MODEL_REGISTRY
from fairseq.models.transformer import TransformerConfig
from fairseq.tasks import TASK_DATACLASS_REGISTRY
from fairseq.tasks.translation import TranslationConfig

import figures
from mkdocs_hooks import ARCHITECTURE_SECTIONS
from testing_utils import PLUGIN_ARCHS, PLUGIN_MODELS, REPO

pytestmark = pytest.mark.docs
DOCS = REPO / "docs"
INHERITED = {f.name for base in (TransformerConfig, TranslationConfig, FairseqDataclass)
             for f in dataclasses.fields(base)} | {"label_smoothing", "report_accuracy", "ignore_prefix_size",
                                                  "sentence_avg", "seed"}


def flags(config) -> list:
    return ["--" + f.name.replace("_", "-") for f in dataclasses.fields(config) if f.name not in INHERITED]


@pytest.mark.parametrize("model", sorted(m.__name__ for m in PLUGIN_MODELS))
def test_every_model_flag_is_on_its_architecture_page(model):
    name, cls = next((n, c) for n, c in MODEL_REGISTRY.items() if c.__name__ == model)
    page = (DOCS / f"{name}.md").read_text()
    assert [f for f in flags(cls.config) if f not in page] == []


def test_every_criterion_and_task_flag_is_documented():
    plugin = [c for registry in (CRITERION_DATACLASS_REGISTRY, TASK_DATACLASS_REGISTRY) for c in registry.values()
              if c.__module__.startswith("fairseq_widearch")]
    docs = "".join(p.read_text() for p in DOCS.glob("*.md"))
    assert plugin and [f for c in plugin for f in flags(c) if f not in docs] == []


def test_every_linked_page_and_image_exists():
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_every_marked_figure_is_written_from_its_row():
    figures.main(["--check"])


def test_the_check_names_a_page_whose_figure_differs_from_its_row(monkeypatch, tmp_path):
    page = tmp_path / "page.md"
    page.write_text("BLEU <!-- figure bleu compare system=widenet -->35.00 ± 0.43 (35.38, 34.77)<!-- end -->.\n")
    monkeypatch.setattr(figures, "pages", lambda: [page])
    monkeypatch.setattr(figures, "REPO", tmp_path)
    with pytest.raises(SystemExit, match="page.md"):
        figures.main(["--check"])
    figures.main([])
    row = figures.bleu("compare", "system=widenet")
    assert not row.startswith("35.00")
    assert page.read_text() == f"BLEU <!-- figure bleu compare system=widenet -->{row}<!-- end -->.\n"





@pytest.mark.parametrize("model", sorted(m.__name__ for m in PLUGIN_MODELS))
def test_every_architecture_page_is_a_reference_in_the_anchors_order(model):
    name = next(n for n, c in MODEL_REGISTRY.items() if c.__name__ == model)
    assert re.findall(r"^## (.+)$", (DOCS / f"{name}.md").read_text(), re.M) == list(ARCHITECTURE_SECTIONS)


#: Each page's budget in lines: README 150, every page of docs/ (an architecture's included) 250.
#: The manual's total is reported after the tests (tests/conftest.py), not capped.
BUDGETS = {"README.md": 150}


def manual() -> list:
    """The manual's pages: README and docs/*.md; the API pages (built from docstrings) and the dated
    records (docs/records) are apart."""
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", [p.relative_to(REPO).as_posix() for p in manual()])
def test_each_page_keeps_within_its_own_budget(page):
    assert len((REPO / page).read_text().splitlines()) <= BUDGETS.get(page, 250)


def test_the_presets_rows_are_those_the_figures_script_names():
    """docs/data/presets.jsonl is written by ``python tools/figures.py --presets``: one row per
    preset it names, with the stats tool's arguments and the paper's count it gives."""
    assert [(r["name"], r["argv"], r["paper_params"]) for r in figures.rows("presets")] == [
        (name, argv, paper) for name, (argv, paper, _) in figures.PRESETS.items()]


#: Words that narrate a change (what an option was, what replaced it): a reference page says what
#: is; the history is git's and CHANGELOG.md's, dated runs are docs/records'.
NARRATIVE = (r"former(ly)?", r"removed", r"replaced", r"no longer", r"no more", r"anymore", r"used to", r"previously",
             r"originally", r"predates?", r"of (its|their) time", r"(was|were) (changed|renamed)", r"until now",
             r"now (is|are|uses?|has|have)", r"earlier (versions?|runs?)", r"(re)?introduced", r"deprecated",
             r"superseded", r"changed", r"old default", r"new default", r"last run")
#: A date: ISO (2026-11-28, 2026-11), also inside a file name, or a month and year.
DATE = r"(?<!\d)20\d\d-\d\d(-\d\d)?(?!\d)|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* 20\d\d\b"
#: Lines where a narrative word says what is, each by a phrase only it holds: (page, phrase).
ALLOWED = {
    ("docs/fairseq_fixes.md", "symbolic link is replaced by a file"),  # what the save does, each time
}


def reference_lines():
    """(page, line number, line) of README.md and docs/*.md, with the generated figures (their rows
    carry dates) and link targets (a record's anchor names its date) taken out."""
    for page in manual():
        text = re.sub(r"<!-- figure .*?<!-- end -->", "", page.read_text(), flags=re.S)
        for number, line in enumerate(text.splitlines(), 1):
            yield page.relative_to(REPO).as_posix(), number, re.sub(r"\]\([^)]*\)", "]", line)


def test_the_reference_pages_speak_in_the_present_tense():
    """No date outside the generated figures, no narrative of what changed (``NARRATIVE``, ``ALLOWED``)."""
    dated = [f"{page}:{n}: {line}" for page, n, line in reference_lines() if re.search(DATE, line)]
    narrative = [f"{page}:{n}: {line}" for page, n, line in reference_lines()
                 if re.search(rf"\b(?:{'|'.join(NARRATIVE)})\b", line, re.I)
                 and not any(page == allowed and phrase in line for allowed, phrase in ALLOWED)]
    assert dated == [] and narrative == []


def test_the_scalable_pages_stage_2_command_is_the_comparisons():
    from fairseq_widearch.experiments.compare import SCALABLE_STAGE2
    assert " ".join(SCALABLE_STAGE2) in (DOCS / "scalable_transformer.md").read_text()


def test_the_index_lists_every_records_page():
    index = (DOCS / "index.md").read_text()
    assert [p.name for p in sorted((DOCS / "records").glob("*.md")) if f"records/{p.name}" not in index] == []


def test_readme_has_a_row_for_every_architecture():
    readme = (REPO / "README.md").read_text()
    assert [arch for arch in PLUGIN_ARCHS if f"\n| `{arch}` |" not in readme] == []
