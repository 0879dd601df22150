"""The analysis plots: each command writes a PNG and prints the numbers it drew."""
import json

import pytest
import torch

from fairseq_widearch.cli import plot_expert_load, plot_path_weights, plot_scalable_widths

PNG = b"\x89PNG"


def test_path_weight_diversity_is_figure_7s_measure():
    assert plot_path_weights.diversity(torch.tensor([1.0, 3.0]), 2) == pytest.approx(0.5)
    # n = 3: mean over the three pairs; the "more features" weights after the paths are left out
    assert plot_path_weights.diversity(torch.tensor([1.0, 1.0, 3.0, 9.0]), 3) == pytest.approx((0 + 0.5 + 0.5) / 3)


@pytest.mark.slow
def test_path_weights_plot_has_one_row_per_multi_path_sublayer(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "paths.png"
    plot_path_weights.main([str(tiny_checkpoint("multipath_transformer_tiny") / "checkpoint_last.pt"), "--out", str(out)])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| encoder") or
            line.startswith("| decoder")]
    # tiny: 2 encoder layers x (attention, FFN) with 3 paths; 2 decoder layers x (self, cross, FFN) with 2
    assert len(rows) == 2 * 2 + 2 * 3
    assert out.read_bytes()[:4] == PNG


@pytest.mark.slow
def test_path_weights_of_a_model_without_paths_is_an_error(tiny_checkpoint, tmp_path):
    with pytest.raises(SystemExit, match="no multi-path sub-layer"):
        plot_path_weights.main([str(tiny_checkpoint("widenet_tiny") / "checkpoint_last.pt"),
                                "--out", str(tmp_path / "x.png")])


def expert_load(checkpoint, data, out, *extra):
    return plot_expert_load.main(["--checkpoint", str(checkpoint), "--data", str(data), "--out", str(out),
                                  "--max-sentences", "200", *extra])


@pytest.mark.slow
@pytest.mark.parametrize("routing", [[], ["--inference-routing"]])
def test_expert_load_per_block_and_dropped_rate(routing, tiny_checkpoint, multi30k_bin, tmp_path, capsys):
    out = tmp_path / "load.png"
    expert_load(tiny_checkpoint("widenet_tiny") / "checkpoint_last.pt", multi30k_bin, out, *routing)
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| encoder")
            or line.startswith("| decoder")]
    assert [r[0] for r in rows] == ["| encoder 1", "| encoder 2", "| encoder 3", "| decoder 1", "| decoder 2"]
    for row in rows:
        shares, dropped = [float(v) for v in row[1:-1]], float(row[-1].rstrip("% |"))
        assert len(shares) == 4 and sum(shares) == pytest.approx(1, abs=0.01) and 0 <= dropped < 100
        if routing:  # inference capacity 0 = no limit: nothing is dropped
            assert dropped == 0
    assert out.read_bytes()[:4] == PNG


@pytest.mark.slow
def test_expert_load_of_a_dense_model_is_an_error(tiny_checkpoint, multi30k_bin, tmp_path):
    with pytest.raises(SystemExit, match="no MoE router"):
        expert_load(tiny_checkpoint("partialformer_tiny") / "checkpoint_last.pt", multi30k_bin, tmp_path / "x.png")


@pytest.mark.slow
def test_scalable_widths_plot_bleu_and_loss_per_width(tiny_checkpoint, multi30k_bin, tmp_path, capsys):
    bleu = tmp_path / "bleu.jsonl"
    bleu.write_text(json.dumps({"label": "stage 1", "widths": ["64", "128"], "bleu": [1.5, 2.5]}) + "\n"
                    + json.dumps({"label": "exported 64", "widths": ["exported"], "bleu": [1.5]}) + "\n")
    out = tmp_path / "widths.png"
    checkpoint = tiny_checkpoint("scalable_transformer_tiny") / "checkpoint_last.pt"
    plot_scalable_widths.main(["--bleu", str(bleu), "--checkpoint", f"tiny={checkpoint}", "--data", str(multi30k_bin),
                               "--max-sentences", "100", "--out", str(out)])
    lines = capsys.readouterr().out.splitlines()
    assert "| sacreBLEU | stage 1 | 64: 1.50 128: 2.50" in lines
    loss = next(line for line in lines if line.startswith("| valid loss"))
    assert [w.split(":")[0] for w in loss.split(" | ")[-1].split(" ") if ":" in w] == ["64", "128"]
    assert out.read_bytes()[:4] == PNG
