"""Deployment with CTranslate2 (README "Deploying"): Multi30k-trained ``_tiny`` checkpoints that end
in a standard Transformer (a pruned latent-depth model; scalable type-1 exports with the I/O
projections and I/O-cropped), converted by ``python -m fairseq_widearch.cli.export_ctranslate2``,
translate the validation sentences as ``fairseq-generate`` does: the same hypothesis for at least 95 %
of them in fp32, greedy and beam 5, and int8 within 0.5 BLEU of fp32.

``WIDEARCH_DEPLOY_REPORT=FILE`` appends one JSON line per case to FILE (the figures of README
"Deploying"): the share of identical hypotheses, how many of the others run to the length limit
in either engine, and both BLEU scores."""
import json
import os
import re

import pytest
import torch

from testing_utils import REPO, cli, fairseq, train

ctranslate2 = pytest.importorskip("ctranslate2")
sacrebleu = pytest.importorskip("sacrebleu")

#: Enough for hypotheses that mostly end before the length limit (where the engines' beam searches
#: end differently: fairseq forces </s> and scores it, CTranslate2 stops) at a tolerable test time:
#: a scalable model's update trains several widths, many times a latent-depth update's time; latent
#: depth's BLEU after 100 updates is too low (about 1) for int8's 0.5-BLEU bound to mean anything.
UPDATES = {"latent_depth_transformer_tiny": 200, "scalable_transformer_tiny": 100}
FLAGS = ["--lr", "0.005", "--max-tokens", "2048"]
SCALABLE = ["--task", "scalable_translation", "--criterion", "scalable_self_distillation", "--distill-stage", "1"]
#: fairseq-generate decodes the batches of rank 0 of 5 (240 of valid's 1,014 sentences)
SHARD = ["--distributed-world-size", "5", "--distributed-rank", "0"]
#: Tokens before </s> at most (fairseq-generate's --max-len-b; short runs loop until it)
MAX_LEN = 60


def report(**row):
    if os.environ.get("WIDEARCH_DEPLOY_REPORT"):
        with open(os.environ["WIDEARCH_DEPLOY_REPORT"], "a") as f:
            f.write(json.dumps(row) + "\n")


def tool(module, *args):
    return cli(f"fairseq_widearch.cli.{module}", *args)


def pruned_latent(data, root):
    train(data, root, "latent_depth_transformer_tiny", *FLAGS, max_update=UPDATES["latent_depth_transformer_tiny"])
    state = torch.load(root / "checkpoint_last.pt")
    # posteriors decided (the tiny run is too short for them to leave 0.5): keep 2 of 3 decoder layers
    state["model"]["encoder.layer_select.logits"][0] = torch.tensor([3.0, 3.0])
    state["model"]["decoder.layer_select.logits"][0] = torch.tensor([3.0, -3.0, 3.0])
    torch.save(state, root / "decided.pt")
    proc = tool("prune_latent_layers", "--checkpoint", root / "decided.pt", "--out", root / "model.pt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root / "model.pt"


def scalable_export(data, root, *extra):
    train(data, root, "scalable_transformer_tiny", *SCALABLE, *FLAGS, *extra,
          max_update=UPDATES["scalable_transformer_tiny"])
    proc = tool("export_subnet", "--checkpoint", root / "checkpoint_last.pt", "--width", 64, "--out", root / "model.pt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root / "model.pt"


MODELS = {"latent pruned": pruned_latent, "scalable type-1, projections": scalable_export,
          "scalable type-1, I/O-cropped": lambda data, root: scalable_export(data, root, "--no-io-projections")}


@pytest.fixture(scope="module")
def deployed(multi30k_bin, tmp_path_factory):
    """name -> (fairseq checkpoint, CTranslate2 fp32 directory, int8 directory), built once."""
    built = {}

    def get(name):
        if name not in built:
            root = tmp_path_factory.mktemp(re.sub(r"\W+", "_", name))
            checkpoint = MODELS[name](multi30k_bin, root)
            for quantization in ("fp32", "int8"):
                extra = ["--quantization", "int8"] if quantization == "int8" else []
                proc = tool("export_ctranslate2", "--checkpoint", checkpoint, "--data", multi30k_bin,
                           "--out", root / quantization, *extra)
                assert proc.returncode == 0, proc.stderr[-2000:]
            built[name] = checkpoint, root / "fp32", root / "int8"
        return built[name]

    return get


def fairseq_generate(data, checkpoint, beam):
    """``{id: (source tokens, reference, hypothesis tokens)}`` of fairseq-generate on valid shard 0."""
    out = fairseq("generate", data, "--path", checkpoint, "--user-dir", REPO / "fairseq_widearch",
                  "--gen-subset", "valid", "--beam", beam, "--max-len-b", MAX_LEN, "--cpu", "--batch-size", "64",
                  *SHARD).stdout
    lines = {}
    for line in out.splitlines():
        m = re.match(r"([STH])-(\d+)\t(.*)", line)
        if m:
            lines.setdefault(int(m[2]), {})[m[1]] = m[3].split("\t")[-1]
    return {i: (v["S"].split(), v["T"], v["H"].split()) for i, v in lines.items()}


def ctranslate2_translate(model_dir, sources, beam):
    translator = ctranslate2.Translator(str(model_dir), device="cpu")
    results = translator.translate_batch(sources, beam_size=beam, max_batch_size=64, max_decoding_length=MAX_LEN)
    return [r.hypotheses[0] for r in results]


def bleu(hypotheses, references):
    return sacrebleu.corpus_bleu([" ".join(h).replace("@@ ", "") for h in hypotheses],
                                 [[r.replace("@@ ", "") for r in references]], force=True).score


@pytest.mark.slow
@pytest.mark.parametrize("beam", [1, 5], ids=["greedy", "beam 5"])
@pytest.mark.parametrize("name", MODELS)
def test_ctranslate2_translates_as_fairseq_generate(name, beam, deployed, multi30k_bin):
    checkpoint, fp32, int8 = deployed(name)
    generated = fairseq_generate(multi30k_bin, checkpoint, beam)
    assert len(generated) >= 200
    ids = sorted(generated)
    sources, references, expected = ([generated[i][k] for i in ids] for k in range(3))
    hypotheses = ctranslate2_translate(fp32, sources, beam)
    differ = [(h, e) for h, e in zip(hypotheses, expected) if h != e]
    same = 1 - len(differ) / len(ids)
    quantized = ctranslate2_translate(int8, sources, beam)
    scores = {"bleu_fairseq": bleu(expected, references), "bleu_fp32": bleu(hypotheses, references),
              "bleu_int8": bleu(quantized, references)}
    report(model=name, beam=beam, sentences=len(ids), identical=round(same, 4), differing=len(differ),
           differing_at_length_limit=sum(MAX_LEN in (len(h), len(e)) for h, e in differ),
           **{k: round(v, 2) for k, v in scores.items()})
    assert same >= 0.95, f"{name}, beam {beam}: {same:.1%} of the hypotheses identical"
    assert abs(scores["bleu_int8"] - scores["bleu_fp32"]) <= 0.5


@pytest.mark.slow
def test_other_checkpoints_are_refused_naming_the_reason(tiny_checkpoint, multi30k_bin, tmp_path):
    proc = tool("export_ctranslate2", "--checkpoint", tiny_checkpoint("multipath_transformer_tiny") / "checkpoint_last.pt",
               "--data", multi30k_bin, "--out", tmp_path / "ct2")
    assert proc.returncode != 0 and "CTranslate2 has no layer for it" in proc.stderr
    assert not (tmp_path / "ct2").exists()
