"""The GPU machine's prepared command (benchmarks/gpu_check.sh) in its ``--dry-run``: every step
with its CPU stand-ins, the same report, so that the command cannot rot while no GPU runs it."""
import json
import re
import subprocess
import sys

import pytest

from testing_utils import REPO, benchmark


@pytest.mark.slow
@pytest.mark.e2e
def test_the_dry_run_writes_the_whole_report(multi30k_bin, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", REPO / "benchmarks" / "gpu_check.sh", out, "--dry-run", "--data", multi30k_bin.parent],
                          capture_output=True, text=True, timeout=900, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["profile.log", "report.json", "report.md", "speed.log",
                                                      "tier.log", "two_ranks.log"]
    assert report["dry_run"] and report["steps"]["tier"]["collect"]["rc"] == 0
    # every test of the CUDA tier named, each skipped here for want of CUDA
    assert len(report["tier_tests"]) >= 40 and all(o.startswith("skipped") for o in report["tier_tests"].values())
    # in the order the GPU's workers take them: the slowest, never reached before, first
    assert next(iter(report["tier_tests"])).endswith("decoding_scores_as_fp32_decoding[scalable_transformer_tiny-fp16]")
    two = report["steps"]["two_ranks"]["two_ranks"]["json"]["results"]["multipath_transformer_tiny"]
    assert two["ok"] and two["ranks_identical"]
    markdown = (out / "report.md").read_text()
    for label, res in report["steps"]["speed"].items():
        assert res["rc"] == 0 and res["json"], label
    moe = report["steps"]["speed"]["moe bf16 256 tokens"]["json"]
    assert moe["ratio"] > 0 and moe["moe_ms"] > 0 and moe["dense_ms"] > 0, moe
    assert f"MoE / K·C dense {moe['ratio']}" in markdown
    utilisation = report["steps"]["speed"]["widenet utilisation bf16 batch 4"]["json"]
    settings = {"device", "dtype", "matmul_peak_tflops", "batch_size", "src_len", "tgt_len"}
    assert set(utilisation) - settings == {"widenet_tiny"} and "ratio" in utilisation["widenet_tiny"], utilisation
    # PartialFormer's three attention kernels timed side by side in one model
    kernels = report["steps"]["speed"]["fused attention bf16"]["json"]["kernels"]["partialformer_tiny"]
    assert {"auto_ms", "explicit_ms", "sdpa_ms"} <= kernels.keys() and "step time / auto's" in markdown
    assert report["steps"]["profile"]["profile"]["json"]["moe"]["moe"]["kernels_per_step"] > 0
    assert re.search(r"\*\*CUDA tier\*\*: \d+ skipped", markdown) and "| multipath_transformer_tiny | True |" in markdown


def test_host_syncs_runs_each_precision_and_counts_the_moe_calls():
    """benchmarks/host_syncs.py (a CUDA count, run in the CUDA tier) on the CPU, where it counts no
    sync: the model cast (``--dtype``, as --fp16/--bf16; not stepped) or fp32 under autocast
    (``--autocast``, as --amp; stepped), as the dtypes of its parameters and of its MoE products
    say; WideNet's MoE calls per training pass (3 + 3 blocks) and per decoding step (the decoder's
    3, the encoder's 3 once over the target's positions)."""
    tgt_len, systems = 3, ["widenet", "transformer"]
    for precision, parameters, products in ((["--dtype", "fp16"], "torch.float16", "torch.float16"),
                                            (["--dtype", "bf16", "--autocast"], "torch.float32", "torch.bfloat16")):
        counted = benchmark("host_syncs", "--device", "cpu", "--systems", ",".join(systems), *precision, "--steps", "1",
                            "--warmup", "1", "--tgt-len", tgt_len, "--src-len", 4, "--batch-size", 2, "--vocab", 100)
        assert counted["parameter_dtypes"] == dict.fromkeys(systems, [parameters])
        assert counted["stepped"] == dict.fromkeys(systems, "--autocast" in precision)
        assert counted["moe_product_dtypes"] == {"widenet": [products], "transformer": []}
        assert counted["moe_calls_per_pass"] == {"widenet": 6, "transformer": 0}
        assert counted["moe_calls_per_decoding_step"] == {"widenet": 3 + 3 / tgt_len, "transformer": 0}
