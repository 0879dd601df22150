"""Mixed precision across ranks, on the CPU (benchmarks/two_ranks.py): fairseq's
distributed trainer with 2 gloo ranks, ``--bf16`` or ``--memory-efficient-bf16`` (FP16Optimizer's
fp32 master weights, half-precision gradients all-reduced), each DDP backend, every ``_tiny``
preset (the scalable one under its task): the ranks end with identical parameters and every
update's loss equals one rank's with ``--update-freq 2`` over the same batches. Each preset, backend
and precision at least once, not their product. The GPU machine runs the same check in fp16."""
import pytest

from testing_utils import benchmark

pytestmark = pytest.mark.e2e  # each test's subject is a process: the ranks the benchmark starts

#: (preset, DDP backend, precision): every preset under pytorch_ddp (fairseq's GPU default: a
#: parameter outside the loss's graph fails the step), one under legacy_ddp, both precisions.
#: Multi-path's pytorch_ddp bf16 case is the GPU check's dry run's (tests/test_gpu_check.py: 1,024
#: tokens, tolerance 0.02); WideNet under legacy_ddp in bf16 is no longer run, test_conformance's
#: two-rank test runs it in fp32.
CASES = [("widenet_tiny", "pytorch_ddp", "memory_efficient_bf16"),
         ("partialformer_tiny", "pytorch_ddp", "bf16"),
         ("latent_depth_transformer_tiny", "pytorch_ddp", "memory_efficient_bf16"),
         ("scalable_transformer_tiny", "pytorch_ddp", "bf16"),
         ("scalable_transformer_tiny", "legacy_ddp", "memory_efficient_bf16")]
#: Relative difference allowed between the two runs' loss at each update. The deterministic presets
#: agree to fairseq's 3 logged decimals; latent depth's Gumbel samples and WideNet's router noise
#: are drawn per rank (0.0035 and 0.0002 at most over 24 fp16 updates on the H100).
TOLERANCE = 0.01


@pytest.mark.slow
@pytest.mark.parametrize("arch,backend,precision", CASES)
def test_two_bf16_ranks_train_as_one_rank_with_update_freq_2(arch, backend, precision, multi30k_bin, tmp_path):
    result = benchmark("two_ranks", "--data", multi30k_bin, "--archs", arch, "--device", "cpu", "--precision", precision,
                       "--ddp-backend", backend, "--updates", 4, "--max-tokens", 512, "--tolerance", TOLERANCE,
                       "--work-dir", tmp_path)["results"][arch]
    assert result["ranks_identical"] and result["updates"] == 4
    assert result["max_relative_loss_difference"] <= TOLERANCE, (result["loss_two_ranks"],
                                                                  result["loss_one_rank_update_freq_2"])
    assert result["loss_two_ranks"][-1] < result["loss_two_ranks"][0]  # they trained
