"""Each architecture's own-data path runs end to end as the manual gives it: README's preparation of
raw text ("Train on your own data": Moses tokenisation, joint BPE, ``fairseq-preprocess``), then the
first block of the architecture page's "Usage" (training with the architecture's criterion, task
and stages, decoding, scoring), run by bash on a few hundred sentence pairs of Multi30k with the
budget cut to a few updates. README's table sends each architecture to its block."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from testing_utils import REPO
from fairseq_widearch.experiments.settings import criterion

#: architecture -> its page; each page's "Usage" opens with its own-data block.
PAGES = {arch: REPO / "docs" / f"{arch}.md" for arch in ("multipath_transformer", "widenet", "scalable_transformer",
                                                         "latent_depth_transformer", "partialformer")}
SLICE = {"train": 200, "valid": 20, "test": 20}  # sentence pairs per split
UPDATES = 2


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


def readme_preparation() -> str:
    """README's own-data commands up to ``fairseq-preprocess`` (training and decoding are the page's)."""
    block = fenced_bash(section((REPO / "README.md").read_text(), "Train on your own data"))[0]
    return block[:block.index("fairseq-train")]


def as_test(block: str) -> str:
    """The block with the budget cut to a few updates, decoding cut to 10 tokens a sentence (an
    untrained model runs to the length limit) and the plugin named by its path (the tests run
    outside the repository root)."""
    block = re.sub(r"--max-update \d+", f"--max-update {UPDATES}", block)
    block = block.replace("--bpe-codes bpe/codes", "--bpe-codes bpe/codes --max-len-a 0 --max-len-b 10")
    return block.replace("--user-dir fairseq_widearch", f"--user-dir {REPO / 'fairseq_widearch'}")


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


def bash(script: str, cwd):
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, f"{script}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, multi30k_dir):
    """A slice of Multi30k as raw text, prepared by README's commands."""
    work = tmp_path_factory.mktemp("own_data")
    (work / "raw").mkdir()
    names = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
    for split, lines in SLICE.items():
        for lang in ("en", "de"):
            text = (multi30k_dir / f"{names[split]}.{lang}").read_text().splitlines(keepends=True)[:lines]
            (work / "raw" / f"{split}.{lang}").write_text("".join(text))
    bash(readme_preparation(), work)
    return work


def test_every_architecture_page_opens_its_usage_with_its_own_data_block_and_readme_points_there():
    readme = section((REPO / "README.md").read_text(), "Train on your own data")
    for arch in PAGES:
        block = usage_block(arch)
        trains = [line for line in block.splitlines() if "fairseq-train" in line or line.startswith("TRAIN=(")]
        assert trains, arch
        flags = " ".join(block.replace("\\\n", " ").split())
        trained_by = "scalable_self_distillation" if arch == "scalable_transformer" else criterion(arch)
        assert f"--arch {arch}_multi30k" in flags and f"--criterion {trained_by}" in flags, arch
        assert "fairseq-generate" in block and "sacrebleu raw/test.de" in block, arch
        assert f"docs/{arch}.md#usage" in readme, f"README's own-data table does not point to {arch}'s block"


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(PAGES))
@pytest.mark.e2e
def test_the_own_data_path_trains_decodes_and_scores(prepared, tmp_path, arch):
    for name in ("data-bin", "bpe", "raw"):
        (tmp_path / name).symlink_to(prepared / name)
    scores = bleu_scores(bash(as_test(usage_block(arch)), tmp_path))
    assert len(scores) == (3 if arch == "scalable_transformer" else 1)  # one per width of the scalable model
    hyps = sorted(tmp_path.glob("hyp*.de"))
    assert len(hyps) == len(scores) and all(len(h.read_text().splitlines()) == SLICE["test"] for h in hyps)
    assert not any(p.suffix == ".pt" for p in prepared.rglob("*")), "the block wrote into the prepared data"
    shutil.rmtree(tmp_path / "checkpoints")
