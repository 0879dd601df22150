"""Raw input edge cases through stock ``fairseq-interactive`` for every architecture: an empty
line, a line longer than ``--max-source-positions`` and characters the model has never seen."""
import re

import pytest

from testing_utils import REPO, TINY_ARCHS, fairseq

MAX_SOURCE_POSITIONS = 32
LINES = ["A man is riding a bike.",
         "",
         " ".join(["the dog runs in the park"] * 20),  # ~120 tokens > MAX_SOURCE_POSITIONS
         "Ein ∮ naïve 🐕 — «Zürich» ½ \u00a0 ☃ 東京 café"]
TOO_LONG = 2


def interactive(checkpoint, data, *extra):
    bpe = data.parent / "bpe" / "codes"
    return fairseq("interactive", data, "--user-dir", REPO / "fairseq_widearch", "--path", checkpoint,
                   "--cpu", "--beam", 2, "--max-len-b", 8, "--source-lang", "en", "--target-lang", "de",
                   "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", bpe,
                   "--max-source-positions", MAX_SOURCE_POSITIONS, *extra, stdin="\n".join(LINES) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_empty_too_long_and_unknown_input_is_translated_or_skipped_with_a_warning(arch, multi30k_bin, tiny_checkpoint):
    proc = interactive(tiny_checkpoint(arch) / "checkpoint_last.pt", multi30k_bin,
                       "--skip-invalid-size-inputs-valid-test")
    hypotheses = {int(i) for i in re.findall(r"^H-(\d+)\t", proc.stdout, re.M)}
    assert hypotheses == set(range(len(LINES))) - {TOO_LONG}
    assert re.search(rf"1 samples have invalid sizes and will be skipped, max_positions=\({MAX_SOURCE_POSITIONS}, ",
                     proc.stderr)
    unknown_source = re.search(rf"^S-{len(LINES) - 1}\t(.*)$", proc.stdout, re.M).group(1)
    assert "<unk>" in unknown_source

