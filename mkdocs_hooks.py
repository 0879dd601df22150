"""mkdocs hooks. The site's quick-start page (``quickstart.md``, which only the site has) is README's
"Quick start" and "Train on your own data", generated when the site is built, so that the two read
the same and are written once. The navigation's architectures are the pages with an architecture
page's sections, and each API page renders every module of its package: a new architecture's page
and modules join the site by themselves. README's links, relative to the repository root (``docs/usage.md``), are made
relative to docs/ (``usage.md``); a link to a file outside docs/ fails the build, naming it. The
pages link those sections in README, as GitHub shows them (``../README.md#quick-start``); the site
links its quick-start page instead."""
import re
from pathlib import Path

ROOT = Path(__file__).parent
README = ROOT / "README.md"
#: An architecture's page: these sections, in this order (tests/test_docs.py holds each page to them).
ARCHITECTURE_SECTIONS = ("Idea", "Usage", "Results", "Fidelity", "Limitations", "Citation")
#: README's sections the site's quick-start page holds.
SECTIONS = ("Quick start", "Train on your own data")
#: Their anchors, which the pages' links to README name.
INCLUDED = {heading.lower().replace(" ", "-") for heading in SECTIONS}


def readme_section(heading: str) -> str:
    """README's ``## heading`` section, heading included, up to the next ``## `` heading.

    Raises:
        KeyError: if README has no such section (the build fails, naming it).
    """
    text = README.read_text()
    match = re.search(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", text, re.M | re.S)
    if match is None:
        raise KeyError(f"README.md has no section '## {heading}'")
    return match.group(0)


def relative_to_docs(markdown: str) -> str:
    """``markdown`` with README's links to docs/ pages made relative to docs/.

    Raises:
        ValueError: for a relative link to a file outside docs/, which the site does not hold.
    """
    def link(match):
        target = match.group(1)
        if re.match(r"[a-z]+://|#", target):
            return match.group(0)
        if not target.startswith("docs/"):
            raise ValueError(f"README links {target}, which is outside docs/: the site cannot include it")
        return f"]({target[len('docs/'):]})"
    return re.sub(r"\]\(([^)\s]+)\)", link, markdown)


def links_to_the_site(markdown: str, src_uri: str) -> str:
    """The links of the page ``src_uri`` (relative to docs/) to README's sections the site holds made
    links to its quick-start page."""
    up = "../" * src_uri.count("/")

    def link(match):
        return f"]({up}quickstart.md#{match.group(1)})" if match.group(1) in INCLUDED else match.group(0)
    return re.sub(rf"\]\({re.escape(up)}\.\./README\.md#([\w-]+)\)", link, markdown)


def on_files(files, config, **kwargs):
    """Add the quick-start page, README's sections with their links made the site's."""
    from mkdocs.structure.files import File
    text = "# Quick start and your own data\n\n" + "\n".join(relative_to_docs(readme_section(s)) for s in SECTIONS)
    files.append(File.generated(config, "quickstart.md", content=text))
    return files


def architecture_pages() -> list:
    """The pages of docs/ with an architecture page's sections, by name."""
    return sorted(page.name for page in (ROOT / "docs").glob("*.md")
                  if tuple(re.findall(r"^## (.+)$", page.read_text(), re.M)) == ARCHITECTURE_SECTIONS)


def api_sections(package: str) -> str:
    """An API page's body: every module of ``fairseq_widearch.<package>``, rendered from its docstrings."""
    modules = sorted(path.stem for path in (ROOT / "fairseq_widearch" / package).glob("[!_]*.py"))
    return "".join(f"\n## `fairseq_widearch.{package}.{m}`\n\n::: fairseq_widearch.{package}.{m}\n" for m in modules)


def on_config(config, **kwargs):
    """The navigation's "Architectures": every architecture page (``architecture_pages``)."""
    for section in config["nav"]:
        if isinstance(section, dict) and "Architectures" in section:
            section["Architectures"] = architecture_pages()
    return config


def on_page_markdown(markdown, page, **kwargs):
    api = re.fullmatch(r"api/(\w+)\.md", page.file.src_uri)
    if api:
        markdown += api_sections(api.group(1))
    return links_to_the_site(markdown, page.file.src_uri)
