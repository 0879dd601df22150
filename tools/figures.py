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
import importlib
import importlib.util
import io
import json
import re
import shlex
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "docs" / "data"
MARKED = re.compile(r"(<!-- figure (?P<args>[^>]*?) -->)(?P<text>.*?)(<!-- end -->)", re.S)
DEEP = ["--arch", "transformer", "--encoder-normalize-before", "--decoder-normalize-before", "--share-all-embeddings"]
#: The rows of presets.jsonl: name -> (the stats tool's arguments, the paper's parameter count in
#: millions where a table of the paper gives one, the label of the pages' tables).
PRESETS = {
    "widenet_b": (["--arch", "widenet_b"], None, None),
    "widenet_l": (["--arch", "widenet_l"], None, None),
    "widenet_h": (["--arch", "widenet_h"], None, None),
    "widenet_wmt_en_de": (["--arch", "widenet_wmt_en_de"], None, None),
    "scalable_transformer_wmt_en_de": (["--arch", "scalable_transformer_wmt_en_de", "--vocab-size", "32768"], None, None),
    "multipath_transformer_6l_2p": (["--arch", "multipath_transformer_6l_2p", "--vocab-size", "35000"], 80, None),
    "multipath_transformer_12l_2p": (["--arch", "multipath_transformer_12l_2p", "--vocab-size", "35000"], 118, None),
    "multipath_transformer_6l_4p": (["--arch", "multipath_transformer_6l_4p", "--vocab-size", "35000"], 118, None),
    "multipath_transformer_12l_3p": (["--arch", "multipath_transformer_12l_3p", "--vocab-size", "35000"], 156, None),
    "multipath_transformer_6l_6p": (["--arch", "multipath_transformer_6l_6p", "--vocab-size", "35000"], 156, None),
    "multipath_transformer_24l_2p": (["--arch", "multipath_transformer_24l_2p", "--vocab-size", "35000"], 193, None),
    "multipath_transformer_12l_4p": (["--arch", "multipath_transformer_12l_4p", "--vocab-size", "35000"], 193, None),
    "multipath_transformer_6l_8p": (["--arch", "multipath_transformer_6l_8p", "--vocab-size", "35000"], 193, None),
    "deep6": ([*DEEP, "--encoder-layers", "6", "--vocab-size", "35000"], 62, "`transformer` Deep6 (pre-norm)"),
    "deep12": ([*DEEP, "--encoder-layers", "12", "--vocab-size", "35000"], 80, "`transformer` Deep12 (pre-norm)"),
    "deep24": ([*DEEP, "--encoder-layers", "24", "--vocab-size", "35000"], 118, "`transformer` Deep24 (pre-norm)"),
    "deep36": ([*DEEP, "--encoder-layers", "36", "--vocab-size", "35000"], 156, "`transformer` Deep36 (pre-norm)"),
    "deep48": ([*DEEP, "--encoder-layers", "48", "--vocab-size", "35000"], 193, "`transformer` Deep48 (pre-norm)"),
    "latent_depth_transformer_lld_12_24":
        (["--arch", "latent_depth_transformer_lld_12_24", "--vocab-size", "33000"], 135, None),
    "latent_depth_transformer_lld_12_48":
        (["--arch", "latent_depth_transformer_lld_12_48", "--vocab-size", "33000"], 211, None),
    "latent_depth_transformer_llboth_36_36":
        (["--arch", "latent_depth_transformer_llboth_36_36", "--vocab-size", "33000"], 224, None),
    "latent_depth_transformer_llboth_48_48":
        (["--arch", "latent_depth_transformer_llboth_48_48", "--vocab-size", "33000"], 287, None),
    "latent_depth_transformer_llboth_64_64":
        (["--arch", "latent_depth_transformer_llboth_64_64", "--vocab-size", "33000"], 371, None),
    "partialformer_6_6_d512_h24_16": (["--arch", "partialformer_6_6_d512_h24_16", "--vocab-size", "34040"], 63, None),
    "partialformer_24_6_d512_h24_16": (["--arch", "partialformer_24_6_d512_h24_16", "--vocab-size", "34040"], 115, None),
    "partialformer_24_6_d360_h24_16": (["--arch", "partialformer_24_6_d360_h24_16", "--vocab-size", "34040"], 61, None),
    "partialformer_24_6_d360_h30_16": (["--arch", "partialformer_24_6_d360_h30_16", "--vocab-size", "34040"], 68, None),
    "partialformer_24_6_d360_h8_8": (["--arch", "partialformer_24_6_d360_h8_8", "--vocab-size", "34040"], 36, None),
    "partialformer_24_6_d320_h24_24": (["--arch", "partialformer_24_6_d320_h24_24", "--vocab-size", "19064"], 48, None),
}


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


def signed(x: float) -> str:
    return f"{x:+.2f}".replace("-", "−")


def two_sides(args) -> list:
    """The BLEU scores by seed of the rows ``FILE key=value...`` before ``vs`` and of those after it."""
    split = args.index("vs")
    sides = []
    for name, *conditions in (args[:split], args[split + 1:]):
        scores = {r["seed"]: r["bleu"] for r in selected(name, conditions)}
        if len(scores) < 2:
            raise SystemExit(f"{name}.jsonl: {len(scores)} rows with {' '.join(conditions)}; a spread needs two")
        sides.append(scores)
    return sides


def gap(*args: str) -> str:
    """``+d (s)``: the mean BLEU of the rows ``FILE key=value...`` minus that of the rows after ``vs``
    (``FILE key=value...``), and the sum of the two seed spreads (a gap counts where it exceeds it)."""
    a, b = (list(side.values()) for side in two_sides(args))
    return f"{signed(statistics.mean(a) - statistics.mean(b))} ({statistics.stdev(a) + statistics.stdev(b):.2f})"


def seed_gaps(*args: str) -> str:
    """``+d: +d1, +d2``: as ``gap``, the mean difference, then the difference at each seed both hold."""
    a, b = two_sides(args)
    seeds = sorted(a.keys() & b.keys())
    mean = statistics.mean(a.values()) - statistics.mean(b.values())
    return f"{signed(mean)}: " + ", ".join(signed(a[s] - b[s]) for s in seeds)


def value(name: str, *keys: str) -> str:
    """One value of the JSON file docs/data/``name``, at ``keys``."""
    found = json.loads((DATA / name).read_text())
    for key in keys:
        found = found[key]
    return str(found)


def seed_span(name: str, *conditions: str) -> str:
    """How far apart the selected rows' BLEU scores lie (highest minus lowest), e.g. one system's seeds."""
    scores = [r["bleu"] for r in selected(name, conditions)]
    return f"{max(scores) - min(scores):.2f}"


def span(name: str, field: str, digits: str, *conditions: str) -> str:
    """``lowest-highest`` of ``field`` over the selected rows, to ``digits`` decimals (the quick
    start's BLEU and minutes over its runs)."""
    found = [r[field] for r in selected(name, conditions)]
    return f"{min(found):.{digits}f}-{max(found):.{digits}f}"


def one(name: str, field: str, *conditions: str) -> str:
    """The value of ``field`` that every selected row shares (the machine of the quick start's runs).

    Raises:
        SystemExit: naming the values, where the rows differ.
    """
    found = {str(r[field]) for r in selected(name, conditions)}
    if len(found) != 1:
        raise SystemExit(f"rows of {name}.jsonl differ in {field}: {sorted(found)}")
    return found.pop()


def mean(name: str, field: str, *conditions: str) -> str:
    """The mean of ``field`` over the selected rows, to 3 decimals (a validation loss)."""
    return f"{statistics.mean(r[field] for r in selected(name, conditions)):.3f}"


def speed(system: str, figure: str) -> str:
    """The comparison's side-by-side speed of ``system`` (compare_throughput.json): ``ratio``, its
    training tokens/s over the Transformer's (``1.03x``), or ``utilisation`` (``25.5 %``)."""
    speeds = json.loads((DATA / "compare_throughput.json").read_text())
    if figure == "ratio":
        return f"{speeds[system]['train_tokens_per_s'] / speeds['transformer']['train_tokens_per_s']:.2f}x"
    return f"{100 * speeds[system]['utilisation']:.1f} %"


def compare() -> str:
    """The comparison's table (docs/results.md): its 12 runs and the speeds measured side by side."""
    from fairseq_widearch.experiments import compare as c
    speeds = json.loads((DATA / "compare_throughput.json").read_text())
    return c.table(c.summarise(rows("compare"), speeds))


def claim(name: str) -> str:
    """One claim's table as the claims study prints it (docs/claims.md)."""
    from fairseq_widearch.experiments import study
    return study.table(rows("claims"), study.CLAIMS[name])


def script(relative: str):
    """The module of the script at ``relative`` (to the checkout), loaded from its file (the neighbours
    it imports: its own folder when run as a script, pytest's pythonpath in the tests)."""
    spec = importlib.util.spec_from_file_location(Path(relative).stem, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_report(name: str) -> str:
    """The speed figures of a GPU check's report (docs/data/``name``), each as the check summarises it."""
    gpu_check = script("benchmarks/gpu_check.py")
    report = json.loads((DATA / name).read_text())
    report = report.get("speed_part", report)  # a report of both parts holds the speed part apart
    lines = ["| figure | result |", "|---|---|"]
    lines += [f"| {label} | {gpu_check.speed_summary(res['json'])} |"
              for label, res in report["steps"]["speed"].items() if res.get("json")]
    return "\n".join(lines)


def head_to_head() -> str:
    """The latent-depth head-to-head's table, as ``head_to_head.py report`` prints it."""
    recipe = script("examples/latent_depth/head_to_head.py")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        recipe.main(["report", "--results", str(DATA / "latent_depth_o2m.jsonl")])
    return out.getvalue().split("\n\n")[0].strip()


def stats(field: str, *presets: str) -> str:
    """A stats-tool figure of each preset, from docs/data/presets.jsonl: parameters in millions, MACs
    in billions, listed as 'a, b and c'."""
    by_arch = {r["name"]: r for r in rows("presets")}
    scale, unit = (1e9, "B") if field.startswith("macs") else (1e6, "M")
    values = [f"{by_arch[p][field] / scale:.2f}{unit}" for p in presets]
    return ", ".join(values[:-1]) + (" and " if len(values) > 1 else "") + values[-1]


#: The estimate's assumptions: an H100's (or H200's) dense bf16 peak, the share of it a training step
#: uses, and the bytes per parameter of mixed-precision Adam (fp32 master weights, m and v; 16-bit
#: weights and gradients).
GPU_PEAK_FLOPS, GPU_UTILISATION, BYTES_PER_PARAM = 989e12, 0.30, 16


def gpu_estimate(*names: str) -> str:
    """Per preset (every row of presets.jsonl without names), an estimate from its MACs: training
    FLOPs per target token (2 FLOPs per MAC, the backward pass twice the forward, one 20 + 20-token
    pair's MACs over its 20 target tokens), the GPU-hours one billion target tokens take at
    ``GPU_UTILISATION`` of ``GPU_PEAK_FLOPS``, and the memory of the weights and Adam's state
    (activations, which ``--max-tokens`` sets, left out)."""
    by_name = {r["name"]: r for r in rows("presets")}
    names = names or list(by_name)  # every row
    lines = ["| preset | params | training GFLOPs per target token | GPU-hours per 10⁹ target tokens "
             "(estimate) | weights + Adam state |", "|---|---|---|---|---|"]
    for name in names:
        r = by_name[name]
        flops = 2 * 3 * r["macs"] / 20
        hours = flops * 1e9 / (GPU_UTILISATION * GPU_PEAK_FLOPS) / 3600
        lines.append(f"| {PRESETS[name][2] or f'`{name}`'} | {r['params'] / 1e6:.0f}M | {flops / 1e9:.2f} | {hours:.1f} | "
                     f"{r['params'] * BYTES_PER_PARAM / 2 ** 30:.1f} GiB |")
    return "\n".join(lines)


def sizes(*names: str) -> str:
    """A table of the presets' parameters against their paper's and MACs of one 20 + 20-token pair."""
    by_name = {r["name"]: r for r in rows("presets")}
    lines = ["| preset | paper | ours | Δ | MACs (20+20) |", "|---|---|---|---|---|"]
    for name in names:
        r, label = by_name[name], PRESETS[name][2] or f"`{name}`"
        if r["paper_params"] is None:
            raise SystemExit(f"{name}: PRESETS gives no paper count to set it against")
        lines.append(f"| {label} | {r['paper_params']}M | {r['params'] / 1e6:.2f}M | "
                     f"{100 * (r['params'] / 1e6 / r['paper_params'] - 1):+.1f}% | {r['macs'] / 1e9:.2f}B |")
    return "\n".join(lines)


def cost(name: str) -> str:
    """The cost table of docs/data/``name`` (benchmarks/operator_counts.py's closing line): per preset,
    training and decoding operators against the twin's, host waits and atomic adds, and the operators
    run most more often than the twin in training; CPU throughput per FLOP where the row has it."""
    table = json.loads((DATA / name).read_text())
    lines = [f"{table['date']}, {table['hardware']}, `{table['command']}`: batches of {table['batch_size']} x "
             f"{table['src_len']} + {table['tgt_len']} tokens, vocabulary {table['vocab']:,}.", "",
             "| preset | twin encoder layers | training operators / twin's | host waits (twin) | atomic adds (twin) "
             "| decoding operators / twin's | decoding waits, atomic adds (twin) "
             "| CPU throughput per FLOP / twin's (time over the twin's) | most run more often than the twin (training) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for system, row in table.items():
        if not isinstance(row, dict) or "train" not in row:
            continue
        train, decode = row["train"], row["decode"]
        speed = f"{row['throughput_per_flop']:.2f}" if "throughput_per_flop" in row else "not timed"
        if row.get("slower"):  # the operators whose time exceeds the twin's most in one profiled step
            speed += " (" + ", ".join(f"{op} +{ms:g} ms" for op, ms in row["slower"]) + ")"
        more = ", ".join(f"{op} +{n}" for op, n in train["excess"][:3])
        lines.append(f"| `{system}` | {row['twin_encoder_layers']} | {train['operators']:,} / {train['twin']['operators']:,} "
                     f"= {train['ratio']:.3f} | {train['host_waits']} ({train['twin']['host_waits']}) | "
                     f"{train['atomic_adds']} ({train['twin']['atomic_adds']}) | {decode['ratio']:.3f} | "
                     f"{decode['host_waits']}, {decode['atomic_adds']} ({decode['twin']['host_waits']}, "
                     f"{decode['twin']['atomic_adds']}) | {speed} | {more} |")
    return "\n".join(lines)


def fixes() -> str:
    """The table of the plugin's fairseq fixes, from their registry (``fairseq_fixes.FIXES``): each
    fix's name, what it replaces, what fairseq does without it, the upstream issue and the
    launchers it is tested under (tests/test_fairseq_fixes.py and its neighbours run them)."""
    from fairseq_widearch.fairseq_fixes import FIXES, TRAINING

    def markdown(text):
        return re.sub(r"``(.+?)``", r"`\1`", text)

    def launchers(names):
        return "every training launcher" + "".join(f", {n}" for n in names if n not in TRAINING) \
            if set(TRAINING) <= set(names) else ", ".join(names)

    lines = ["| fix | replaces | without it | upstream | tested under |", "|---|---|---|---|---|"]
    for name, fix in FIXES.items():
        replaces = "<br>".join(f"`{target.replace(':', '.')}`" for target in fix.replaces) or \
            "nothing (torch's allow-list)"
        lines.append(f"| `{name}` | {replaces} | {markdown(fix.why)} | {fix.upstream or ''} | {launchers(fix.launchers)} |")
    return "\n".join([*lines, "", "On CPUs the spawn rows run with the spawning process told of two devices "
                                   "([Every launcher](#every-launcher))."])


def flag(source: str, name: str) -> str:
    """The value of flag ``name`` in the flag list ``source`` (``module:ATTRIBUTE``), e.g. the
    comparison's stage-2 ``--warmup-init-lr``."""
    module, attribute = source.split(":")
    flags = [str(f) for f in getattr(importlib.import_module(module), attribute)]
    return flags[flags.index(name) + 1]


WRITERS = {writer.__name__: writer for writer in (fixes, flag, cost, bleu, gap, seed_gaps, value, speed, seed_span, span, one,
                                                   mean, compare, claim, head_to_head, gpu_report, stats, sizes, gpu_estimate)}


def written(text: str) -> str:
    def figure(match):
        name, *args = shlex.split(match.group("args"))
        if name not in WRITERS:
            raise SystemExit(f"<!-- figure {match.group('args')} -->: no writer {name!r}; writers: {', '.join(WRITERS)}")
        body = WRITERS[name](*args)
        # a table stands on its own lines; an inline figure stays inside its sentence
        body = f"\n{body}\n" if "\n" in match.group("text") or "\n" in body else body
        return match.group(1) + body + match.group(4)
    return MARKED.sub(figure, text)


def pages() -> list:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def write_presets():
    """docs/data/presets.jsonl from the stats tool, one line per row of ``PRESETS``."""
    from fairseq_widearch.cli import stats as tool
    lines = []
    for name, (argv, paper, _) in PRESETS.items():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            tool.main(argv)
        row = {"name": name, "argv": argv, "paper_params": paper, **json.loads(out.getvalue().strip().splitlines()[-1])}
        lines.append(json.dumps(row))
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
