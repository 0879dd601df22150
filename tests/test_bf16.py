"""bf16 without a TPU (README, "What else the plugin fixes"; ``fairseq_fixes.bf16_without_tpu`` and
``bf16_inference``): fairseq turns ``--bf16`` into ``--tpu`` and fails without torch_xla, and its
decoders ignore ``--bf16``. On the CPU: every ``_tiny`` preset (the scalable one under its task)
trains with ``--cpu --bf16``, bf16 parameters and fp32 master weights, a finite and falling loss;
its checkpoint decodes every test sentence with and without ``--bf16``. The CUDA tier
(tests/cuda) trains the same in bf16 to a model that translates and compares the BLEU."""
import math
import sys
from unittest import mock

import pytest
import torch
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.trainer import Trainer
from omegaconf import OmegaConf

from fairseq_widearch.experiments.runner import train_inner
from fairseq_widearch.experiments.scoring import corpus_bleu, read_hypotheses
from fairseq_widearch.model_builder import build_model
from testing_utils import (
    LOGPROB_TOLERANCE,
    OWN_SELF_ATTENTION,
    REPO,
    TIER_TRAIN_FLAGS,
    TIER_UPDATES,
    TINY_ARCHS,
    TINY_CASES,
    causal_kernel_against_masks,
    check_training,
    criterion_for,
    decode,
    fairseq,
    fp32_islands,
    incremental_against_full,
    train,
)

UPDATES = 12
#: bf16 decoding of a 12-update model may differ from its fp32 decoding by this much sacreBLEU
#: (both are near 0 here; the CUDA tier compares models that translate, within 1.0).
BLEU_TOLERANCE = 1.0


def master_dtypes(optimizer) -> list:
    master = getattr(optimizer, "fp32_params", None)  # FP16Optimizer: a flat tensor, a list, or lists per device
    if master is None:
        return []
    tensors = [master] if hasattr(master, "dtype") else master
    tensors = [t for ts in tensors.values() for t in ts] if isinstance(tensors, dict) else tensors
    return sorted({str(t.dtype) for t in tensors})


def bf16_train(data, save, arch, *precision):
    """fairseq-train ``arch`` in bf16 on the CPU; -> one record per update of the dtypes the trainer
    holds: ``params`` (the model's), ``master`` (the optimizer's fp32 master copy, [] without one),
    ``optimizer`` (its class) and ``loss``."""
    records, step = [], Trainer.train_step

    def recorded(self, samples, raise_oom=False):
        out = step(self, samples, raise_oom)
        records.append({"params": sorted({str(p.dtype) for p in self.model.parameters()}),
                        "master": master_dtypes(self.optimizer), "optimizer": type(self.optimizer).__name__,
                        "loss": float(out["loss"]) if out else None})
        return out

    with mock.patch.object(Trainer, "train_step", recorded):
        # lr 0.003: a loss that falls in 12 updates
        train(data, save, arch, *TINY_CASES[arch], "--lr", "0.003", *(precision or ["--bf16"]), max_update=UPDATES)
    return records


@pytest.fixture(scope="module")
def bf16_trained(tmp_path_factory, multi30k_bin):
    """arch -> (its save directory, its update records), each trained once."""
    done = {}

    def get(arch):
        if arch not in done:
            save = tmp_path_factory.mktemp(f"{arch}_bf16")
            done[arch] = save, bf16_train(multi30k_bin, save, arch)
        return done[arch]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_every_tiny_preset_trains_in_bf16_on_the_cpu(arch, bf16_trained):
    _, records = bf16_trained(arch)
    assert len(records) == UPDATES
    assert all(r["params"] == ["torch.bfloat16"] and r["master"] == ["torch.float32"] for r in records), records[0]
    losses = [r["loss"] for r in records]
    assert all(math.isfinite(loss) for loss in losses), losses
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses


@pytest.mark.slow
def test_memory_efficient_bf16_trains_bf16_parameters_without_a_master_copy(tmp_path, multi30k_bin):
    records = bf16_train(multi30k_bin, tmp_path, "multipath_transformer_tiny", "--memory-efficient-bf16")
    assert {r["optimizer"] for r in records} == {"MemoryEfficientFP16Optimizer"}
    assert all(r["params"] == ["torch.bfloat16"] and r["master"] == [] for r in records)
    assert all(math.isfinite(r["loss"]) for r in records)


@pytest.mark.slow
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_a_bf16_checkpoint_decodes_every_sentence_with_and_without_bf16(arch, bf16_trained, multi30k_slice_bin,
                                                                         tmp_path):
    """Every sentence of the first 100 of test_2016 (the checkpoint's dictionaries; the whole set no
    longer: a length or batch that only the rest holds is not decoded here)."""
    save, _ = bf16_trained(arch)
    work = multi30k_slice_bin.parent
    bleu = {}
    for name, flags in (("fp32", []), ("bf16", ["--bf16"])):
        out = tmp_path / f"{name}.txt"
        decode(multi30k_slice_bin, save / "checkpoint_last.pt", out, work / "bpe" / "codes", 2, "1.0",
               *TINY_CASES[arch][:2], "--max-len-a", "0", "--max-len-b", "8", *flags)
        assert len(read_hypotheses(out)) == len((work / "test.ref.de").read_text().splitlines()) == 100
        bleu[name] = corpus_bleu(out, work / "test.ref.de")[0].score
    assert abs(bleu["bf16"] - bleu["fp32"]) <= BLEU_TOLERANCE, bleu


def training_cfg(tmp_path, *flags):
    parsed = options.parse_args_and_arch(options.get_training_parser(),
                                         [str(tmp_path), "--arch", "transformer", "--cpu", *flags])
    return convert_namespace_to_omegaconf(parsed)


def tpu_seen_by_main(cfg):
    seen = []
    distributed_utils.call_main(cfg, lambda c: seen.append((c.common.tpu, c.distributed_training.tpu)))
    return seen[0]


def test_bf16_trains_without_a_tpu_where_torch_xla_is_absent(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fairseq-train", str(tmp_path), "--bf16"])
    cfg = training_cfg(tmp_path, "--bf16")
    assert cfg.common.tpu  # fairseq's own parse turns --bf16 into --tpu (upstream #4696)
    assert tpu_seen_by_main(cfg) == (False, False)


def test_bf16_keeps_meaning_a_tpu_with_torch_xla_or_an_explicit_tpu_flag(tmp_path, monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_xla" else find_spec(name, *a))
    assert tpu_seen_by_main(training_cfg(tmp_path, "--bf16")) == (True, True)
    monkeypatch.undo()
    monkeypatch.setattr(sys, "argv", ["fairseq-train", str(tmp_path), "--bf16", "--tpu"])
    assert tpu_seen_by_main(training_cfg(tmp_path, "--bf16", "--tpu")) == (True, True)


@pytest.mark.parametrize("bf16", [True, False])
def test_inference_casts_the_model_to_bf16_only_under_bf16(bf16):
    model = build_model("multipath_transformer_tiny", vocab_size=100)
    model.prepare_for_inference_(OmegaConf.create({"common": {"bf16": bf16}, "generation": {"beam": 5}}))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16 if bf16 else torch.float32}


# The CUDA tier's model-level checks (testing_utils) in bf16 on the CPU.
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_incremental_decoding_equals_full_decoding_in_bf16(arch):
    assert incremental_against_full(arch, "cpu", torch.bfloat16) <= LOGPROB_TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("arch", sorted(OWN_SELF_ATTENTION))
def test_the_causal_kernel_gives_the_masked_log_probabilities_in_bf16(arch):
    assert causal_kernel_against_masks(arch, "cpu", torch.bfloat16) <= LOGPROB_TOLERANCE[torch.bfloat16]


def test_router_gumbel_sigmoid_and_kl_stay_fp32_in_a_bf16_model():
    fp32_islands("cpu", torch.bfloat16)


@pytest.mark.slow
def test_the_tiers_short_schedule_trains_in_bf16_with_finite_statistics(multi30k_bin, tmp_path):
    """The CUDA tier's training check (testing_utils.check_training: every logged figure finite, the loss 1 bit
    lower from the first 3 logs to the last 3) on the CPU in bf16, with the tier's flags (lr 0.005, 100
    warm-up updates, 4,096 tokens) on the 1,000-sentence slice, one preset, over the warm-up of the
    tier's short schedule only (bf16 has no loss scale to watch after it), logged every 10 updates."""
    arch, updates, interval = "multipath_transformer_tiny", min(TIER_UPDATES.values()) // 2, 10
    log = fairseq("train", multi30k_bin, "--user-dir", REPO / "fairseq_widearch", "--arch", arch,
                  "--save-dir", tmp_path, "--cpu", "--bf16", *TIER_TRAIN_FLAGS, "--max-update", updates,
                  "--log-interval", interval, *criterion_for(arch), "--max-tokens", "1024")
    stats = train_inner(log.stdout)
    assert len(stats) == updates // interval
    check_training(stats)
