"""Every block of commands in README and docs that trains, decodes, exports or averages runs as the
flow it is, by bash, from a directory laid out as the repository root (``fairseq_widearch``,
``examples`` linked in), on a few hundred sentence pairs of Multi30k with the budgets cut
(``--max-update``, decoding's length) and nothing else changed: a file a later line reads must come
from an earlier line, or from the prerequisite the page states (another page's block, run first).

README's own-data block prepares raw text (Moses tokenisation, joint BPE, ``fairseq-preprocess``),
trains, decodes and scores; each architecture page's "Usage" opens with the block for that data;
the other blocks continue one of them (FLOWS). A block that cannot run here says why (NOT_RUN)."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

from fairseq_widearch.experiments.settings import criterion
from testing_utils import PLUGIN_ARCHS, REPO

PAGES = {arch: REPO / "docs" / f"{arch}.md" for arch in PLUGIN_ARCHS}
SLICE = {"train": 200, "valid": 20, "test": 20}  # sentence pairs per split
UPDATES = 2
#: Commands that start a training, a decoding, an export or an average.
RUNS = re.compile(r"fairseq-(train|generate|interactive|hydra-train)\b|torchrun|average_checkpoints|export_subnet|"
                  r"export_ctranslate2|prune_latent_layers|search_subnets|distillation_targets|bash examples/|"
                  r"fairseq_widearch\.experiments|bash benchmarks/")
#: Blocks run below, each by a phrase only it holds: page -> phrases.
FLOWS = {"README.md": ["fairseq-preprocess --source-lang en"],
         **{f"docs/{arch}.md": ["sacrebleu raw/test.de"] for arch in PLUGIN_ARCHS},
         "docs/scalable_transformer.md": ["sacrebleu raw/test.de", "--distill-stage 3"],
         "docs/latent_depth_transformer.md": ["sacrebleu raw/test.de", "--tgt de,fr,cs"],
         "docs/deploy.md": ["prune_latent_layers"],
         "docs/usage.md": ["--num-update-checkpoints", "--distributed-backend gloo"]}
#: Blocks not run, by a phrase only each holds, and why.
NOT_RUN = {
    ("README.md", "bash examples/multi30k/quickstart.sh"): "the quick start and the suite themselves "
                                                          "(tests/test_quickstart.py runs the quick start)",
    ("docs/claims.md", "bash examples/claims/multi30k.sh"): "ways to start the whole study, each many hours "
                                                            "(tests/test_claims_study.py runs its paths on tiny presets)",
    ("docs/results.md", "bash examples/compare/multi30k.sh"): "the comparison on all of Multi30k "
                                                              "(tests/test_compare.py runs it on a slice)",
    ("docs/scalable_transformer.md", "wmt14_en_de.sh DATA_BIN"): "WMT14 on GPUs: data and devices this suite "
                                                                 "does not have",
    ("docs/partialformer.md", "--train-flags \"--partialformer-init ours\""):
        "the measurement behind its table (two trainings of the comparison; tests/test_compare.py runs the "
        "comparison on a slice, tests/test_init_scale.py the scales)",
    ("docs/gpu.md", "gpu_check.sh /tmp/dry --dry-run"): "tests/test_gpu_check.py runs the dry run on prepared data",
    ("docs/gpu.md", "--part correctness"): "a GPU machine's",
}


def fenced_bash(text: str) -> list:
    return re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S)


def section(text: str, heading: str) -> str:
    """The markdown of the ``## heading`` section, up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def usage_block(arch: str) -> str:
    """The first shell block of the page's "Usage", which comes before its first subsection."""
    usage = section(PAGES[arch].read_text(), "Usage")
    subsection = usage.find("\n### ")
    assert "```bash" in usage[:subsection if subsection > 0 else None], f"{arch}: Usage does not open with its block"
    return fenced_bash(usage)[0]


def block(page: str, phrase: str) -> str:
    found = [b for b in fenced_bash((REPO / page).read_text()) if phrase in b]
    assert len(found) == 1, f"{page}: {len(found)} blocks hold {phrase!r}"
    return found[0]


def commands(text: str) -> list:
    """The block's commands: its lines, continuations joined, without blank lines and comments."""
    return [line for line in text.replace("\\\n", " ").splitlines() if line.strip() and not line.lstrip().startswith("#")]


def as_test(text: str) -> str:
    """The block with the budget cut to a few updates and decoding cut to 10 tokens a sentence (an
    untrained model runs to the length limit)."""
    text = re.sub(r"--max-update \d+", f"--max-update {UPDATES}", text)
    return re.sub(r"\bfairseq-generate ", "fairseq-generate --max-len-a 0 --max-len-b 10 ", text)


def bleu_scores(text: str) -> list:
    """The BLEU scores sacrebleu printed in ``text``, one JSON object each (fairseq's logs passed over)."""
    decoder, found, at = json.JSONDecoder(), [], text.find("{")
    while at >= 0:
        try:
            value, end = decoder.raw_decode(text, at)
            found += [value["score"]] if isinstance(value, dict) and value.get("name") == "BLEU" else []
        except json.JSONDecodeError:
            end = at + 1
        at = text.find("{", end)
    return found


def bash(script: str, cwd, **env):
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1", **env}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, f"{script}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    return proc.stdout


def like_the_root(work):
    """``work`` laid out as the repository root, as the manual runs its blocks."""
    for name in ("fairseq_widearch", "examples"):
        (work / name).symlink_to(REPO / name)
    return work


def raw_slice(multi30k_dir, out, langs=("en", "de"), names=None):
    """The first SLICE lines of each split, named ``names[split].lang``."""
    names = names or {"train": "train", "valid": "valid", "test": "test"}
    out.mkdir(parents=True)
    release = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
    for split, lines in SLICE.items():
        for lang in langs:
            text = (multi30k_dir / f"{release[split]}.{lang}").read_text().splitlines(keepends=True)[:lines]
            (out / f"{names[split]}.{lang}").write_text("".join(text))
    return out


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, multi30k_dir):
    """README's own-data block, run whole on a slice of Multi30k: the data it prepares (``data-bin``,
    ``bpe``, ``raw``) is the other blocks' prerequisite. Returns (its directory, its output)."""
    work = like_the_root(tmp_path_factory.mktemp("own_data"))
    raw_slice(multi30k_dir, work / "raw")
    return work, bash(as_test(block("README.md", "fairseq-preprocess --source-lang en")), work)


@pytest.fixture
def after_readme(prepared, tmp_path):
    """A fresh directory holding README's prepared data, for a block that starts from it."""
    started = time.time()
    for name in ("data-bin", "bpe", "raw"):
        (tmp_path / name).symlink_to(prepared[0] / name)
    yield like_the_root(tmp_path)
    written = [p for name in ("data-bin", "bpe", "raw") for p in prepared[0].joinpath(name).rglob("*")
               if p.stat().st_mtime > started]
    assert not written, f"a block wrote into the prepared data: {written}"
    shutil.rmtree(tmp_path / "checkpoints", ignore_errors=True)


def test_every_block_of_commands_that_trains_decodes_exports_or_averages_is_run_or_says_why_not():
    blocks = [(page.relative_to(REPO).as_posix(), b) for page in [REPO / "README.md", *(REPO / "docs").glob("*.md")]
              for b in fenced_bash(page.read_text())]
    running = [(page, b) for page, b in blocks if RUNS.search(b) and len(commands(b)) > 1]
    covered = [(page, b) for page, b in running if any(p in b for p in FLOWS.get(page, []))
               or any(page == p and phrase in b for p, phrase in NOT_RUN)]
    assert [f"{page}: {b[:80]}" for page, b in running if (page, b) not in covered] == []
    for page, phrase in [*((page, p) for page, phrases in FLOWS.items() for p in phrases), *NOT_RUN]:
        block(page, phrase)  # names one block


def test_every_architecture_page_opens_its_usage_with_its_own_data_block_and_readme_points_there():
    readme = section((REPO / "README.md").read_text(), "Train on your own data")
    for arch in PAGES:
        text = usage_block(arch)
        trains = [line for line in text.splitlines() if "fairseq-train" in line or line.startswith("TRAIN=(")]
        assert trains, arch
        flags = " ".join(text.replace("\\\n", " ").split())
        trained_by = "scalable_self_distillation" if arch == "scalable_transformer" else criterion(arch)
        assert f"--arch {arch}_multi30k" in flags and f"--criterion {trained_by}" in flags, arch
        assert "fairseq-generate" in text and "sacrebleu raw/test.de" in text, arch
        assert f"docs/{arch}.md#usage" in readme, f"README's own-data table does not point to {arch}'s block"


@pytest.mark.slow
@pytest.mark.e2e
def test_readmes_own_data_block_prepares_trains_decodes_and_scores(prepared):
    work, out = prepared
    assert len(bleu_scores(out)) == 1 and len((work / "hyp.de").read_text().splitlines()) == SLICE["test"]
    assert (work / "checkpoints" / "multipath" / "checkpoint_best.pt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(PAGES))
@pytest.mark.e2e
def test_each_usage_block_trains_decodes_and_scores(after_readme, arch):
    """The scalable model's stage-3 block continues its Usage block (its ``TRAIN`` array, stage 2's
    checkpoint), so the two run as one; deploy.md's blocks continue the latent-depth one (its
    checkpoint), then convert and translate."""
    then = {"scalable_transformer": block("docs/scalable_transformer.md", "--distill-stage 3"),
            "latent_depth_transformer": block("docs/deploy.md", "prune_latent_layers")}.get(arch, "")
    scores = bleu_scores(bash(as_test(usage_block(arch) + then), after_readme))
    assert len(scores) == (3 if arch == "scalable_transformer" else 1)  # one per width of the scalable model
    hyps = sorted(after_readme.glob("hyp*.de"))
    assert len(hyps) == len(scores) and all(len(h.read_text().splitlines()) == SLICE["test"] for h in hyps)
    if arch == "scalable_transformer":
        assert (after_readme / "checkpoints" / "scalable" / "stage3" / "checkpoint_last.pt").exists()
    if arch == "latent_depth_transformer":  # deploy.md's Python block translates raw text with its model
        deployed_translates(after_readme)


def deployed_translates(work):
    assert (work / "ct2_model" / "model.bin").exists()
    python = re.findall(r"^```python\n(.*?)^```", (REPO / "docs" / "deploy.md").read_text(), re.M | re.S)
    assert len(python) == 1
    translated = subprocess.run([sys.executable, "-c", python[0]], cwd=work, capture_output=True, text=True,
                                timeout=300)
    assert translated.returncode == 0 and translated.stdout.strip(), translated.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.e2e
def test_the_multilingual_block_prepares_three_pairs_trains_and_decodes(multi30k_o2m_dir, tmp_path):
    raw = raw_slice(multi30k_o2m_dir, tmp_path / "raw", ("en", "de", "fr", "cs"),
                    {"train": "train", "valid": "val", "test": "test_2016_flickr"})
    (tmp_path / "root").mkdir()
    work = like_the_root(tmp_path / "root")
    bash(as_test(block("docs/latent_depth_transformer.md", "--tgt de,fr,cs")), work, MULTI30K_DIR=str(raw))
    hyps = [line for line in (work / "gen-fr.out").read_text().splitlines() if line.startswith("H-")]
    assert len(hyps) == SLICE["test"]


@pytest.mark.slow
@pytest.mark.e2e
def test_the_averaging_block_averages_the_checkpoints_its_comment_asks_for(after_readme):
    """Its prerequisite, as its comments state it: a training that keeps 10 interval checkpoints and
    its last 5 epoch checkpoints in ``checkpoints/run`` (the multi-path Usage block's, 4 updates, 2 an
    epoch: interval checkpoints at updates 1 and 3); the block averages 2 of each."""
    training = usage_block("multipath_transformer").split("fairseq-generate")[0]
    training = re.sub(r"--max-update \d+", "--max-update 4", training).replace("--no-epoch-checkpoints", "")
    training = training.replace("--save-dir checkpoints/multipath", "--save-dir checkpoints/run --save-interval-updates 1 "
                                "--keep-interval-updates 10 --keep-last-epochs 5")
    averaging = re.sub(r"--num-(update|epoch)-checkpoints \d+", r"--num-\1-checkpoints 2",
                       block("docs/usage.md", "--num-update-checkpoints"))
    bash(training + averaging, after_readme)
    # the block's last line wins: the mean of the last 2 epoch checkpoints, parameter by parameter
    run = after_readme / "checkpoints" / "run"
    epochs = [torch.load(run / f"checkpoint{e}.pt", weights_only=False)["model"] for e in (1, 2)]
    averaged = torch.load(after_readme / "avg.pt", weights_only=False)["model"]
    assert averaged.keys() == epochs[0].keys() and "optimizer_history" not in averaged
    for name, value in averaged.items():
        torch.testing.assert_close(value, sum(e[name].double() for e in epochs).div(2).to(value.dtype))


@pytest.mark.slow
@pytest.mark.e2e
def test_the_torchrun_blocks_cpu_line_trains_with_two_workers(after_readme):
    """The block's other lines need 8 GPUs, or two machines of them."""
    lines = block("docs/usage.md", "--distributed-backend gloo").replace("\\\n", " ").splitlines()
    cpu = next(line for line in lines if "--cpu" in line and line.startswith("torchrun"))
    bash(as_test(cpu), after_readme)
    assert (after_readme / "checkpoints" / "checkpoint_last.pt").exists()
