"""The scalable_transformer workflow on Multi30k through fairseq's CLIs: stage 1 -> stage 2 with
scalable_translation + scalable_self_distillation, validation per width, and export_subnet (the
exported model decodes like its parent at that width and has the stats tool's parameter count)."""
import json
import re
import subprocess
import sys

import pytest
import torch

from testing_utils import REPO, cli, ddp_train, fairseq, train

STAGE = ["--task", "scalable_translation", "--criterion", "scalable_self_distillation"]
VALIDATE = ["--validate-interval-updates", "4", "--max-valid-steps", "2"]


@pytest.fixture(scope="module")
def stages(multi30k_bin, tmp_path_factory):
    """A tiny model after 4 updates of stage 1 and 4 of stage 2 (fresh optimizer, as each paper stage)."""
    root = tmp_path_factory.mktemp("scalable")
    first = train(multi30k_bin, root / "stage1", "scalable_transformer_tiny", *STAGE, "--distill-stage", "1",
                  max_update=4).stdout
    second = train(multi30k_bin, root / "stage2", "scalable_transformer_tiny", *STAGE, "--distill-stage", "2",
                   "--restore-file", root / "stage1" / "checkpoint_last.pt", "--reset-optimizer",
                   "--reset-dataloader", "--reset-meters", "--lambda2-anneal-updates", "2", *VALIDATE,
                   max_update=4, validate=True).stdout
    return root, first, second


def logged(stdout, key):
    return [float(v) for v in re.findall(rf"\b{key}[= ]([\d.]+)", stdout)]


@pytest.mark.slow
def test_stages_log_every_term_and_validation_logs_three_widths(stages):
    _, first, second = stages
    assert logged(first, "widest_loss") and logged(first, "sub_loss") and not logged(first, "distill_loss")
    assert logged(second, "distill_loss") and logged(second, "distill_lambda")[:3] == [1.0, 0.75, 0.5]
    valid = [line for line in second.splitlines() if "valid on 'valid' subset" in line][-1]
    assert logged(valid, "loss_w64") and logged(valid, "loss_w128")
    assert logged(valid, "loss")[0] == logged(valid, "loss_w128")[0]  # --eval-width defaults to the widest


def export(*args):
    return cli("fairseq_widearch.cli.export_subnet", *args)


def hypotheses(data, checkpoint, *extra):
    out = fairseq("generate", data, "--path", checkpoint, "--user-dir", REPO / "fairseq_widearch",
                  "--gen-subset", "valid", "--beam", "4", "--lenpen", "0.6", "--max-len-b", "10", "--cpu",
                  "--batch-size", "64", "--num-shards", "8", "--shard-id", "0", *extra).stdout
    return sorted(line for line in out.splitlines() if line.startswith("H-"))


@pytest.mark.slow
@pytest.mark.parametrize("width,layer_widths", [(64, None), (128, "64,128,128,64")])
def test_exported_sub_transformer_decodes_like_its_parent(stages, multi30k_bin, width, layer_widths):
    root, _, _ = stages
    parent, out = root / "stage2" / "checkpoint_last.pt", root / f"export_{width}.pt"
    proc = export("--checkpoint", parent, "--width", width, "--out", out,
                  *(["--layer-widths", layer_widths] if layer_widths else []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = torch.load(out)
    assert state["last_optimizer_state"] is None
    layer_tensors = {k: v for k, v in state["model"].items() if ".layers." in k}
    assert max(max(v.shape) for v in layer_tensors.values()) == (4 * 128 if layer_widths else 4 * 64)
    vocab = state["model"]["encoder.embed_tokens.weight"].size(0)
    stats = cli("fairseq_widearch.cli.stats", "--arch", "scalable_transformer_tiny", "--vocab-size", vocab,
                "--eval-width", width, *(["--layer-widths", layer_widths] if layer_widths else []))
    assert stats.returncode == 0, stats.stderr
    exported_params = {t.data_ptr(): t.numel() for k, t in state["model"].items() if not k.endswith(".version")}
    assert sum(exported_params.values()) == json.loads(stats.stdout.splitlines()[-1])["params"]
    assert f"{json.loads(stats.stdout.splitlines()[-1])['params']:,} parameters" in proc.stdout
    eval_width = layer_widths or str(width)
    parent_hyps = hypotheses(multi30k_bin, parent, "--task", "scalable_translation", "--eval-width", eval_width)
    assert len(parent_hyps) > 100 and hypotheses(multi30k_bin, out) == parent_hyps


@pytest.mark.slow
def test_export_errors_name_the_problem(stages, multi30k_bin, tmp_path):
    root, _, _ = stages
    proc = export("--checkpoint", root / "stage2" / "checkpoint_last.pt", "--width", "96", "--out", tmp_path / "x.pt")
    assert proc.returncode != 0 and "--width 96" in proc.stderr and "multiples of 64" in proc.stderr
    train(multi30k_bin, tmp_path / "transformer", "transformer_tiny", max_update=1)
    proc = export("--checkpoint", tmp_path / "transformer" / "checkpoint_last.pt", "--width", "64", "--out",
                  tmp_path / "y.pt")
    assert proc.returncode != 0 and "holds a 'transformer_tiny' model, not a scalable_transformer" in proc.stderr


@pytest.mark.slow
def test_task_refuses_a_model_without_sub_transformers(multi30k_bin, tmp_path):
    refusal = "fairseq-train: error: --task scalable_translation needs a scalable_transformer arch, not 'transformer_tiny'"
    with pytest.raises(AssertionError, match=refusal):
        train(multi30k_bin, tmp_path, "transformer_tiny", "--task", "scalable_translation", max_update=1)


def search(checkpoint, data, *extra):
    return cli("fairseq_widearch.cli.search_subnets", "--checkpoint", checkpoint, "--data", data, "--max-sentences", 40,
               *extra)


@pytest.mark.slow
def test_search_ranks_type2_sub_transformers_under_a_macs_budget(stages, multi30k_bin):
    checkpoint = stages[0] / "stage2" / "checkpoint_last.pt"
    proc = search(checkpoint, multi30k_bin, "--num-samples", "15", "--top-k", "15")  # all 2^4 - 1 configurations
    assert proc.returncode == 0, proc.stderr[-3000:]
    widest, *everything = json.loads(proc.stdout.splitlines()[-1])
    assert widest["label"] == "widest" and widest["layer_widths"] == [128] * 4 and len(everything) == 15
    assert [r["valid_nll"] for r in everything] == sorted(r["valid_nll"] for r in everything)
    budget = 0.9 * widest["gmacs"]
    proc = search(checkpoint, multi30k_bin, "--num-samples", "4", "--top-k", "3", "--max-macs", str(budget), "--bleu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, *top = json.loads(proc.stdout.splitlines()[-1])
    assert len(top) == 3 and all(r["gmacs"] <= budget and r["params"] < widest["params"] for r in top)
    assert all(set(r["layer_widths"]) <= {64, 128} for r in top)
    assert [r["valid_bleu"] for r in top] == sorted((r["valid_bleu"] for r in top), reverse=True)
    proc = search(checkpoint, multi30k_bin, "--choices", "96")
    assert proc.returncode != 0 and "--choices '96'" in proc.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_stage3_targets_are_the_widest_models_filtered_beam_outputs(stages, multi30k_bin, tmp_path):
    root, _, _ = stages
    out = tmp_path / "distilled"
    proc = subprocess.run([sys.executable, REPO / "examples" / "scalable_transformer" / "distillation_targets.py",
                           "--data", multi30k_bin, "--checkpoint", root / "stage2" / "checkpoint_last.pt",
                           "--out", out, "--max-len", "60"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept, total = map(int, re.search(r"kept (\d+) of (\d+)", proc.stdout).groups())
    assert total == 1000 and 100 < kept < total  # the barely trained model rambles past 60 tokens on some
    sources = (out / "text" / "train.en").read_text().splitlines()
    outputs = (out / "text" / "train.de").read_text().splitlines()
    assert len(sources) == len(outputs) == kept
    assert all(len(t.split()) <= 60 and max(len(s.split()) / len(t.split()), len(t.split()) / len(s.split())) <= 20
               for s, t in zip(sources, outputs))
    assert (out / "dict.de.txt").read_text() == (multi30k_bin / "dict.de.txt").read_text()
    assert (out / "valid.en-de.de.bin").resolve() == (multi30k_bin / "valid.en-de.de.bin").resolve()
    stage3 = train(out, tmp_path / "stage3", "scalable_transformer_tiny", *STAGE, "--distill-stage", "3",
                   "--restore-file", root / "stage2" / "checkpoint_last.pt", "--reset-optimizer",
                   "--reset-dataloader", max_update=2).stdout
    assert logged(stage3, "distill_lambda")[0] == 0.9 and logged(stage3, "distill_loss")


def test_stage3_targets_refuse_to_write_an_empty_training_set(monkeypatch, tmp_path):
    """An untrained model's outputs all run to the length limit: a message, not fairseq-train's later
    error on an empty file."""
    import distillation_targets
    looping = {i: ("ein kurzer Satz", " ".join(["der"] * 251)) for i in range(3)}
    monkeypatch.setattr(distillation_targets, "decode_training_set", lambda args: looping)
    with pytest.raises(SystemExit, match=r"none of the 3 decoded training pairs .* --max-len 250"):
        distillation_targets.main(["--data", str(tmp_path), "--checkpoint", "x.pt", "--out", str(tmp_path / "out")])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["legacy_ddp", "pytorch_ddp"])
@pytest.mark.e2e
def test_two_rank_data_parallel_distillation_trains_the_same_sub_transformers(backend, multi30k_bin, tmp_path):
    """Four forward/backward passes per update, all but the last without gradient synchronisation
    (PyTorch DDP's ``no_sync``): every rank draws the same type-2 sub-Transformers (D^i random per
    layer) at every update and ends with the same parameters."""
    states, outs = ddp_train(multi30k_bin, tmp_path, "scalable_transformer_tiny", *STAGE, "--distill-stage", "2",
                             "--lambda2-anneal-updates", "2", "--label-smoothing", "0.1",
                             "--sub-transformer-type", "type2", "--num-sub-transformers", "3", backend=backend)
    drawn = [re.findall(r"^\| drawn (\d+) (.*)$", out, re.M) for out in outs]
    assert len(drawn[0]) == 3 and drawn[0] == drawn[1]
    for name in states[0]:
        assert torch.equal(states[0][name], states[1][name]), f"{name} differs between ranks"
    assert logged(outs[0], "distill_loss")
