"""python -m fairseq_widearch.cli.stats on stock fairseq and plugin architectures."""
import json

import pytest

import figures
from fairseq_widearch.experiments.counting import param_counts, preset_param_counts
from fairseq_widearch.model_builder import build_model
from testing_utils import TINY_ARCHS, cli


def stats(*argv):
    out = cli("fairseq_widearch.cli.stats", *argv)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_stock_deep_prenorm_transformer():
    deep = stats("--arch", "transformer", "--encoder-layers", "24", "--encoder-normalize-before", "--vocab-size", "1000")
    base = stats("--arch", "transformer", "--vocab-size", "1000")
    assert deep["params"] == deep["params_embedding"] + deep["params_encoder"] + deep["params_decoder"]
    assert deep["params_decoder"] == base["params_decoder"]
    # 18 more pre-norm encoder layers (3.15M each at d=512) plus the final encoder LayerNorm
    assert deep["params_encoder"] - base["params_encoder"] == 18 * 3152384 + 1024
    # per source token each extra layer adds ~3.1M MACs (projections + FFN) plus attention
    assert 18 * 20 * 3.1e6 < deep["macs"] - base["macs"] < 18 * 20 * 3.3e6


@pytest.mark.slow
def test_plugin_arch_and_its_flags():
    two = stats("--arch", "multipath_transformer_tiny", "--encoder-paths", "2", "--vocab-size", "100")
    four = stats("--arch", "multipath_transformer_tiny", "--encoder-paths", "4", "--vocab-size", "100")
    assert four["params_encoder"] > two["params_encoder"] and four["macs"] > two["macs"]
    assert four["params_decoder"] == two["params_decoder"]
    # untied source, target and output tables of 100 x 32
    assert two["vocab_size"] == 100 and two["params_embedding"] == 3 * 100 * 32


@pytest.mark.slow
def test_bad_flag_value_is_a_clear_error():
    proc = cli("fairseq_widearch.cli.stats", "--arch", "multipath_transformer_tiny", "--encoder-paths", "0")
    assert proc.returncode != 0 and "--encoder-paths must be a positive integer, got 0" in proc.stderr


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_counts_on_the_meta_device_equal_a_built_models(arch):
    """The paper-size presets' parameter tests count on the meta device (no weights): every
    architecture's counts there equal those of the model built with its weights."""
    built = param_counts(build_model(arch, vocab_size=100))
    assert preset_param_counts(arch, vocab_size=100) == built and built["params"] > 0


@pytest.mark.slow
def test_the_committed_presets_row_is_what_the_tool_prints_today():
    """docs/data/presets.jsonl feeds the pages' sizes and MACs (tools/figures.py)."""
    row = next(r for r in figures.rows("presets") if r["name"] == "widenet_b")
    assert stats(*row.pop("argv")) == {k: v for k, v in row.items() if k not in ("name", "paper_params")}
