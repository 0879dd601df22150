"""Write every figure the manual takes from a committed row, between its markers, from the row.

    python tools/figures.py           # rewrite the marked figures of README.md and docs/*.md
    python tools/figures.py --check   # exit 1 naming each page whose figures differ from their rows

A figure is marked where it is used, inline or around a table::

    <!-- figure bleu compare system=widenet -->35.08 ± 0.43 (35.38, 34.77)<!-- end -->

The first word names a writer below, the rest are its arguments. The rows are the files of
docs/data/: the comparison's and the studies' results (one JSON line per run) and ``presets.jsonl``,
the stats tool's line for each paper-size preset (``--presets`` writes it again, from the code).
The test suite runs ``--check``, so a page cannot differ from its rows; a figure with no row is
stated on one page and the others link to it.
"""
import argparse
import contextlib
import io
import json
import re
import shlex
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "docs" / "data"
MARKED = re.compile(r"(<!-- figure (?P<args>[^>]*?) -->)(?P<text>.*?)(<!-- end -->)", re.S)
#: paper-size presets whose size and MACs the pages give: (preset, stats tool arguments)
PRESETS = {"widenet_b": [], "widenet_l": [], "widenet_h": []}


def rows(name: str) -> list:
    return [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def selected(name: str, conditions) -> list:
    """The rows of docs/data/``name``.jsonl whose ``key`` equals ``value`` for every ``key=value``
    (a key a row lacks reads as ``-``)."""
    wanted = dict(c.split("=", 1) for c in conditions)
    return [r for r in rows(name) if all(str(r.get(k, "-")) == v for k, v in wanted.items())]


def bleu(name: str, *conditions) -> str:
    """``mean ± sd (per seed)`` of the selected rows, in seed order."""
    from fairseq_widearch.experiments.compare import bleu_summary
    found = sorted(selected(name, conditions), key=lambda r: r["seed"])
    if not found:
        raise SystemExit(f"no row of {name}.jsonl has {' '.join(conditions)}")
    return bleu_summary([r["bleu"] for r in found])


def compare() -> str:
    """The comparison's table (docs/results.md): its 12 runs and the speeds measured side by side."""
    from fairseq_widearch.experiments import compare as c
    speeds = json.loads((DATA / "compare_throughput.json").read_text())
    return c.table(c.summarise(rows("compare"), speeds))


def claim(name: str) -> str:
    """One claim's table as the claims study prints it (docs/claims.md)."""
    from fairseq_widearch.experiments import study
    return study.table(rows("claims"), study.CLAIMS[name])


def regime(setting: str, systems: str) -> str:
    """The latent-depth regime test's table of one setting, as ``depth_regime.py table`` prints it."""
    sys.path.insert(0, str(REPO / "examples" / "latent_depth"))
    import depth_regime
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        depth_regime.main(["table", "--results", str(DATA / "latent_depth_regime.jsonl"), "--setting", setting,
                           "--systems", systems])
    return out.getvalue().strip()


def stats(field: str, *presets: str) -> str:
    """A stats-tool figure of each preset, from docs/data/presets.jsonl: parameters in millions, MACs
    in billions, listed as 'a, b and c'."""
    by_arch = {r["arch"]: r for r in rows("presets")}
    scale, unit = (1e9, "B") if field.startswith("macs") else (1e6, "M")
    values = [f"{by_arch[p][field] / scale:.2f}{unit}" for p in presets]
    return ", ".join(values[:-1]) + (" and " if len(values) > 1 else "") + values[-1]


WRITERS = {"bleu": bleu, "compare": compare, "claim": claim, "regime": regime, "stats": stats}


def written(text: str) -> str:
    def figure(match):
        name, *args = shlex.split(match.group("args"))
        body = WRITERS[name](*args)
        # a table stands on its own lines; an inline figure stays inside its sentence
        body = f"\n{body}\n" if "\n" in match.group("text") or "\n" in body else body
        return match.group(1) + body + match.group(4)
    return MARKED.sub(figure, text)


def pages() -> list:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def write_presets():
    """docs/data/presets.jsonl from the stats tool, one line per preset of ``PRESETS``."""
    from fairseq_widearch.cli import stats as tool
    lines = []
    for preset, extra in PRESETS.items():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            tool.main(["--arch", preset, *extra])
        lines.append(out.getvalue().strip().splitlines()[-1])
    (DATA / "presets.jsonl").write_text("\n".join(lines) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs from its rows")
    p.add_argument("--presets", action="store_true", help="first write docs/data/presets.jsonl from the stats tool")
    args = p.parse_args(argv)
    if args.presets:
        write_presets()
    stale = []
    for page in pages():
        text = page.read_text()
        new = written(text)
        if new != text:
            stale.append(page.relative_to(REPO))
            if not args.check:
                page.write_text(new)
    if args.check and stale:
        raise SystemExit("figures differ from their rows in " + ", ".join(map(str, stale))
                         + ": run python tools/figures.py")
    print(("stale: " if args.check else "rewritten: ") + (", ".join(map(str, stale)) or "none"))


if __name__ == "__main__":
    main()
