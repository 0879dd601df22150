"""CUDA tier (``pytest -m cuda``; every test here is skipped where CUDA is absent, so a CPU run is
unchanged): every architecture's ``_tiny`` preset, the scalable one under its own task and
self-distillation criterion, trained on the quick start's Multi30k data with fairseq's ``--fp16``
(FP16Optimizer), ``--memory-efficient-fp16``, ``--amp`` and ``--bf16``; fp16 and bf16 decoding
against fp32 decoding of the same checkpoint; incremental = full decoding in fp16; the causal kernel
against the additive masks in fp16; the fp32 islands of a half-precision model.
docs/records/gpu_runs.md records each run and its figures.

Run alone on the GPU (``OMP_NUM_THREADS=1 python -m pytest tests/cuda -m cuda -v -rfE --tb=short -n 16 --dist
loadgroup --no-loadscope-reorder`` takes minutes; ``-v`` names each test as it ends, so a run cut short
still says which failed; tests/conftest.py orders the tests for 16 workers). Each test does the
work its assertion needs and no more: only the fp16 and bf16 checkpoints are decoded, so only they
train 600 updates (``testing_utils.TIER_UPDATES``), and decoding compares half of test_2016. The data:
``--multi30k-data DIR`` (tests/conftest.py; default ``runs/multi30k/data``, what
``examples/multi30k/setup.sh`` prepares: ``bin/``, ``bpe/codes``, ``test.ref.de``).
``WIDEARCH_CUDA_REPORT=FILE`` appends one JSON line per measured case to FILE (the figures of
docs/records/gpu_runs.md).
"""
import json
import os
from pathlib import Path

import pytest
import torch

from fairseq_widearch.experiments.runner import train_inner
from fairseq_widearch.experiments.scoring import corpus_bleu, read_hypotheses_by_id
from testing_utils import (
    DECODE_HALF,
    LOGPROB_TOLERANCE,
    OWN_SELF_ATTENTION,
    REPO,
    TINY_ARCHS,
    benchmark,
    causal_kernel_against_masks,
    check_training,
    criterion_for,
    decode,
    fairseq,
    fp32_islands,
    incremental_against_full,
)
from testing_utils import TIER_LOG_INTERVAL as LOG_INTERVAL
from testing_utils import TIER_TRAIN_FLAGS as TRAIN_FLAGS
from testing_utils import TIER_UPDATES as UPDATES
from testing_utils import TINY_CASES as CASES

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PRECISIONS = {"fp16": ["--fp16"], "memory_efficient_fp16": ["--memory-efficient-fp16"], "amp": ["--amp"],
              "bf16": ["--bf16"]}


#: The order in which the tier's 16 workers take its 31 units (``--dist loadgroup
#: --no-loadscope-reorder`` hands out the units in collection order, the 17th to the first worker
#: after its first unit, and so on; tests/conftest.py sorts by ``tier_order``): the slowest archs
#: first, so that what a time limit cuts short is what ran before. Units 1-10: the fp16/bf16 trainings
#: with their decoding (each 600 updates and four decodes); 11-16: the short trainings of the archs
#: never reached before; 17-27: the model-level checks (seconds each), after a decoding unit;
#: 28-31: the other short trainings, after a short one.
#: The archs measured, slowest first; another (a new one) follows them until measured.
SLOWEST_FIRST = ("scalable_transformer_tiny", "widenet_tiny", "latent_depth_transformer_tiny", "partialformer_tiny",
                 "multipath_transformer_tiny")
ARCH_ORDER = (*SLOWEST_FIRST, *(arch for arch in TINY_ARCHS if arch not in SLOWEST_FIRST))
DECODED = ("fp16", "bf16")


def training_order(arch, precision) -> tuple:
    a = ARCH_ORDER.index(arch)
    if precision in DECODED:
        return 0, a, DECODED.index(precision), 1  # in its decoding unit, after the decoding test
    return (1 if a < 3 else 3), a, precision


def decoding_order(arch, half) -> tuple:
    return 0, ARCH_ORDER.index(arch), DECODED.index(half), 0


def grouped(halves, order):
    """(arch, precision) cases, each in a pytest-xdist group of its own (``-n N --dist loadgroup``),
    so that the decoding test of a precision runs where its training did and reuses it."""
    return [pytest.param(arch, half, marks=[pytest.mark.xdist_group(f"{arch}-{half}"),
                                            pytest.mark.tier_order(order(arch, half))])
            for arch in TINY_ARCHS for half in halves]


def light(test: int, archs):
    """Parameters of the ``test``-th model-level check, ordered among units 17-27 as ``archs`` is."""
    return [pytest.param(arch, marks=pytest.mark.tier_order((2, test, i))) for i, arch in enumerate(archs)]


#: Half-precision decoding may differ from fp32 decoding of the same checkpoint by this much
#: sacreBLEU (bf16 keeps 8 bits of mantissa to fp16's 11, so its scores move more).
BLEU_TOLERANCE = {"fp16": 0.3, "bf16": 1.0}


def report(**row):
    if os.environ.get("WIDEARCH_CUDA_REPORT"):
        with open(os.environ["WIDEARCH_CUDA_REPORT"], "a") as f:
            f.write(json.dumps(row) + "\n")


@pytest.fixture(scope="session")
def quickstart_data(request):
    work = Path(request.config.getoption("--multi30k-data"))
    if not (work / "bin" / "dict.en.txt").exists():
        pytest.fail(f"the quick start's Multi30k data expected in {work}: run examples/multi30k/setup.sh "
                    "or give --multi30k-data DIR")
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
            log = fairseq("train", quickstart_data / "bin", "--user-dir", REPO / "fairseq_widearch",
                          "--arch", arch, "--save-dir", save, *TRAIN_FLAGS, "--max-update", UPDATES[precision],
                          "--log-interval", LOG_INTERVAL, *criterion, *extra, *PRECISIONS[precision])
            done[arch, precision] = save / "checkpoint_last.pt", train_inner(log.stdout)
        return done[arch, precision]

    return train


@pytest.mark.parametrize("arch,precision", grouped(PRECISIONS, training_order))
def test_mixed_precision_training_is_finite_learns_and_keeps_its_loss_scale(arch, precision, trained):
    _, stats = trained(arch, precision)
    assert len(stats) == UPDATES[precision] // LOG_INTERVAL
    losses, scales = check_training(stats)
    report(test="training", arch=arch, precision=precision, first_loss=losses[0], last_loss=losses[-1],
           min_loss_scale=min(scales, default=None), last_loss_scale=scales[-1] if scales else None)
    assert scales or precision == "bf16"


@pytest.mark.parametrize("arch,half", grouped(DECODED, decoding_order))
def test_half_precision_decoding_scores_as_fp32_decoding(arch, half, trained, quickstart_data, tmp_path):
    checkpoint, _ = trained(arch, half)
    task = CASES[arch][:2]
    bleu = {}
    for name, flags in (("fp32", []), (half, [f"--{half}"])):
        out = tmp_path / f"{name}.txt"
        decode(quickstart_data / "bin", checkpoint, out, quickstart_data / "bpe" / "codes", 5, "1.0", *task,
               *DECODE_HALF, *flags, cpu=False)
        bleu[name] = corpus_bleu(out, quickstart_data / "test.ref.de", part=True)[0].score
        assert len(read_hypotheses_by_id(out)) >= 500  # the same half of test_2016 in both precisions
    report(test="decoding", arch=arch, half=half, bleu_fp32=bleu["fp32"], bleu_half=bleu[half])
    assert bleu["fp32"] > 5.0, bleu  # a model that translates: equal near-zero scores would prove nothing
    assert abs(bleu[half] - bleu["fp32"]) <= BLEU_TOLERANCE[half], bleu


@pytest.mark.parametrize("arch", light(0, ARCH_ORDER))
def test_incremental_decoding_equals_full_decoding_in_fp16(arch):
    difference = incremental_against_full(arch, "cuda", torch.float16)
    report(test="incremental", arch=arch, max_abs_logprob_difference=difference)
    assert difference <= LOGPROB_TOLERANCE[torch.float16]


# (multi-path is never reached)
@pytest.mark.parametrize("arch", light(1, sorted(OWN_SELF_ATTENTION, key=ARCH_ORDER.index, reverse=True)))
def test_the_causal_kernel_gives_the_masked_log_probabilities_in_fp16(arch):
    """Decoder self-attention on SDPA's own causal mask (the flash kernel) against fairseq's
    additive masks, fp16, right-padded targets: the real positions' log-probabilities."""
    difference = causal_kernel_against_masks(arch, "cuda", torch.float16)
    report(test="causal_kernel", arch=arch, max_abs_logprob_difference=difference)
    assert difference <= LOGPROB_TOLERANCE[torch.float16]


@pytest.mark.tier_order((2, 2))
def test_router_gumbel_sigmoid_and_kl_stay_fp32_in_a_half_model():
    fp32_islands("cuda", torch.float16)


@pytest.mark.tier_order((2, 3))
def test_the_models_wait_for_the_gpu_only_to_ask_where_the_padding_is():
    """Host synchronisations per training pass (benchmarks/host_syncs.py) in the models' code,
    ours and fairseq's: only "is there padding / where?" (fairseq's own checks, which ours mirror).
    The MoE layer, its load statistics, the scalable cropping and the latent layer selection add
    none."""
    counted = benchmark("host_syncs")
    for name, per_pass in counted["syncs_per_pass"].items():
        where = counted["sites"][name]
        report(test="host_syncs", system=name, syncs_per_pass=per_pass, where=where)
        models = {site: n for site, n in where.items() if site.startswith(("fairseq/", "models/", "modules/"))}
        # fairseq's decoder asks prev_output_tokens.eq(self.padding_idx).any(), the rest padding_mask.any()
        assert all("padding" in site for site in models), f"{name}: {models}"


@pytest.mark.tier_order((2, 4))
def test_the_moe_layer_waits_for_the_gpu_in_no_precision():
    """WideNet (benchmarks/host_syncs.py) in fp32, in the dtypes of --fp16 and --bf16, under --amp's
    fp16 autocast and under bf16 autocast, in training and in incremental decoding: the MoE layer
    makes no host wait (no count read back, no data-dependent shape); the waits there are, are
    fairseq's and our padding checks."""
    for precision in ([], ["--dtype", "fp16"], ["--dtype", "bf16"], ["--dtype", "fp16", "--autocast"],
                      ["--dtype", "bf16", "--autocast"]):
        counted = benchmark("host_syncs", "--systems", "widenet", "--steps", "2", "--tgt-len", "10", *precision)
        label = " ".join(precision) or "fp32"
        for phase, sites in (("syncs_per_pass", "sites"), ("syncs_per_decoding_step", "decoding_sites")):
            where = counted[sites]["widenet"]
            report(test="moe_host_syncs", system="widenet", precision=label, phase=phase,
                   syncs=counted[phase]["widenet"], where=where)
            assert not [site for site in where if site.startswith("modules/moe.py")], (label, phase, where)
            models = {site: n for site, n in where.items() if site.startswith(("fairseq/", "models/", "modules/"))}
            assert all("padding" in site for site in models), (label, phase, models)
