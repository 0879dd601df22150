"""CUDA tier (``pytest -m cuda``; every test here is skipped where CUDA is absent, so a CPU run is
unchanged): every architecture's ``_tiny`` preset, the scalable one under its own task and
self-distillation criterion, trained on the quick start's Multi30k data with fairseq's
``--fp16`` (FP16Optimizer), ``--memory-efficient-fp16``, ``--amp`` and ``--bf16``; fp16 and bf16
decoding against fp32 decoding of the same checkpoint; incremental = full decoding in fp16; the
causal kernel against the additive masks in fp16; the fp32 islands of a half-precision model. docs/gpu.md records a run and its figures.

Run alone on the GPU (``python -m pytest tests/cuda -m cuda -v -rfE --tb=short -n 5 --dist loadgroup``
takes minutes; ``-v`` names each test as it ends, so a run cut short still says which failed). The data:
``MULTI30K_DATA`` (default ``runs/multi30k/data``, what ``examples/multi30k/setup.sh``
prepares: ``bin/``, ``bpe/codes``, ``test.ref.de``). ``WIDEARCH_CUDA_REPORT=FILE`` appends one JSON
line per measured case to FILE (the figures of docs/gpu.md).
"""
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, TINY_ARCHS, TINY_CASES as CASES, criterion_for, fairseq_cli, run
from test_fused_attention import OWN_SELF_ATTENTION
from tier_checks import (LOGPROB_TOLERANCE, TRAIN_FLAGS as TIER_FLAGS, causal_kernel_against_masks, check_training,
                         fp32_islands, incremental_against_full)
from fairseq_widearch.experiments.runner import train_inner
from fairseq_widearch.experiments.scoring import corpus_bleu, generate

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

#: Enough for a tiny model to translate: multipath_transformer_tiny at these settings, fp32 on the
#: CPU, scored 14.4 BLEU on test_2016 (beam 5) after 600 updates; at 300 updates and lr 0.002 its
#: loss was still 8 bits, too early for decoding to tell fp16 from fp32.
UPDATES = 600
LOG_INTERVAL = 25
PRECISIONS = {"fp16": ["--fp16"], "memory_efficient_fp16": ["--memory-efficient-fp16"], "amp": ["--amp"],
              "bf16": ["--bf16"]}


def grouped(halves):
    """(arch, precision) cases, each in a pytest-xdist group of its own (``-n N --dist loadgroup``),
    so that the decoding test of a precision runs where its training did and reuses it."""
    return [pytest.param(arch, half, marks=pytest.mark.xdist_group(f"{arch}-{half}"))
            for arch in TINY_ARCHS for half in halves]


TRAIN_FLAGS = [*TIER_FLAGS, "--max-update", str(UPDATES), "--log-interval", str(LOG_INTERVAL)]
#: Half-precision decoding may differ from fp32 decoding of the same checkpoint by this much
#: sacreBLEU (bf16 keeps 8 bits of mantissa to fp16's 11, so its scores move more).
BLEU_TOLERANCE = {"fp16": 0.3, "bf16": 1.0}


def report(**row):
    if os.environ.get("WIDEARCH_CUDA_REPORT"):
        with open(os.environ["WIDEARCH_CUDA_REPORT"], "a") as f:
            f.write(json.dumps(row) + "\n")


@pytest.fixture(scope="session")
def quickstart_data():
    work = Path(os.environ.get("MULTI30K_DATA", REPO / "runs" / "multi30k" / "data"))
    if not (work / "bin" / "dict.en.txt").exists():
        pytest.fail(f"the quick start's Multi30k data expected in {work}: run examples/multi30k/setup.sh "
                    "or set MULTI30K_DATA")
    return work


@pytest.fixture(scope="session")
def trained(tmp_path_factory, quickstart_data):
    """(arch, precision) -> (checkpoint, the train_inner statistics), each trained once."""
    done = {}

    def train(arch, precision):
        if (arch, precision) not in done:
            save = tmp_path_factory.mktemp(f"{arch}_{precision}")
            extra = CASES[arch]
            criterion = [] if "--criterion" in extra else criterion_for(arch)
            log = run([fairseq_cli("train"), quickstart_data / "bin", "--user-dir", REPO / "fairseq_widearch",
                       "--arch", arch, "--save-dir", save, *TRAIN_FLAGS, *criterion, *extra,
                       *PRECISIONS[precision]], timeout=900)
            done[arch, precision] = save / "checkpoint_last.pt", train_inner(log.stdout + log.stderr)
        return done[arch, precision]

    return train


@pytest.mark.parametrize("arch,precision", grouped(PRECISIONS))
def test_mixed_precision_training_is_finite_learns_and_keeps_its_loss_scale(arch, precision, trained):
    _, stats = trained(arch, precision)
    assert len(stats) == UPDATES // LOG_INTERVAL
    losses, scales = check_training(stats)
    report(test="training", arch=arch, precision=precision, first_loss=losses[0], last_loss=losses[-1],
           min_loss_scale=min(scales, default=None), last_loss_scale=scales[-1] if scales else None)
    assert scales or precision == "bf16"


@pytest.mark.parametrize("arch,half", grouped(BLEU_TOLERANCE))
def test_half_precision_decoding_scores_as_fp32_decoding(arch, half, trained, quickstart_data, tmp_path):
    checkpoint, _ = trained(arch, half)
    task = CASES[arch][:2]
    bleu = {}
    for name, flags in (("fp32", []), (half, [f"--{half}"])):
        out = tmp_path / f"{name}.txt"
        generate(quickstart_data / "bin", checkpoint, out, quickstart_data / "bpe" / "codes", 5, "1.0", *task, *flags,
                 cpu=False)
        bleu[name] = corpus_bleu(out, quickstart_data / "test.ref.de")[0].score
    report(test="decoding", arch=arch, half=half, bleu_fp32=bleu["fp32"], bleu_half=bleu[half])
    assert bleu["fp32"] > 5.0, bleu  # a model that translates: equal near-zero scores would prove nothing
    assert abs(bleu[half] - bleu["fp32"]) <= BLEU_TOLERANCE[half], bleu


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_incremental_decoding_equals_full_decoding_in_fp16(arch):
    difference = incremental_against_full(arch, "cuda", torch.float16)
    report(test="incremental", arch=arch, max_abs_logprob_difference=difference)
    assert difference <= LOGPROB_TOLERANCE[torch.float16]


@pytest.mark.parametrize("arch", sorted(OWN_SELF_ATTENTION))
def test_the_causal_kernel_gives_the_masked_log_probabilities_in_fp16(arch):
    """Decoder self-attention on SDPA's own causal mask (the flash kernel) against fairseq's
    additive masks, fp16, right-padded targets: the real positions' log-probabilities."""
    difference = causal_kernel_against_masks(arch, "cuda", torch.float16)
    report(test="causal_kernel", arch=arch, max_abs_logprob_difference=difference)
    assert difference <= LOGPROB_TOLERANCE[torch.float16]


def test_router_gumbel_sigmoid_and_kl_stay_fp32_in_a_half_model():
    fp32_islands("cuda", torch.float16)


def test_the_models_wait_for_the_gpu_only_to_ask_where_the_padding_is():
    """Host synchronisations per training pass (benchmarks/host_syncs.py) in the models' code,
    ours and fairseq's: only "is there padding / where?" (fairseq's own checks, which ours mirror,
    and the MoE's rows of real tokens, whose count sets its buffers' shape). The MoE dispatch, its
    load statistics, the scalable cropping and the latent layer selection add none."""
    out = run([sys.executable, REPO / "benchmarks" / "host_syncs.py"]).stdout
    counted = json.loads(out.splitlines()[-1])
    for name, per_pass in counted["syncs_per_pass"].items():
        where = counted["sites"][name]
        report(test="host_syncs", system=name, syncs_per_pass=per_pass, where=where)
        models = {site: n for site, n in where.items() if site.startswith(("fairseq/", "models/", "modules/"))}
        # fairseq's decoder asks prev_output_tokens.eq(self.padding_idx).any(), the rest padding_mask.any()
        assert all("padding" in site for site in models), f"{name}: {models}"
