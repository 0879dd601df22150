"""The CUDA tier's model-level checks as functions of the device and dtype, so that the tier runs them
in fp16 on the GPU (tests/cuda/test_cuda.py) and the CPU runs them in bf16 in every CI run
(tests/test_bf16.py): what fails later on the GPU is then CUDA's alone. Each returns the figure it
measured, for the tier's report."""
import math

import torch

from testing_utils import OWN_SELF_ATTENTION, VOCAB, batch, right_padded_batch
from fairseq_widearch.criterions.latent_depth_label_smoothed_cross_entropy import bernoulli_kl
from fairseq_widearch.model_builder import build_model
from fairseq_widearch.models.base import use_causal_kernel

#: |incremental − full| and |causal kernel − additive masks| log-probabilities: half an ulp at
#: |log p| ≈ 8 is 0.004 in fp16 (11-bit mantissa), 0.03 in bf16 (8 bits).
LOGPROB_TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 8e-2}


def incremental_against_full(arch: str, device: str, dtype: torch.dtype) -> float:
    """Largest |log p| difference between incremental and full decoding of a fresh ``arch``."""
    torch.manual_seed(0)
    model = build_model(arch, vocab_size=VOCAB).to(device=device, dtype=dtype).eval()
    src, lengths, prev = (t.to(device) for t in batch())
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        decoded = model.decoder(prev, encoder_out=encoder_out)
        assert decoded[0].dtype == dtype  # fairseq's log-softmax returns fp32 whatever the logits' dtype
        full = model.get_normalized_probs(decoded, log_probs=True)
        state, steps = {}, []
        for t in range(prev.size(1)):
            out = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
            steps.append(model.get_normalized_probs(out, log_probs=True))
    return (full.float() - torch.cat(steps, dim=1).float()).abs().max().item()


def causal_kernel_against_masks(arch: str, device: str, dtype: torch.dtype) -> float:
    """Decoder self-attention on SDPA's own causal mask against fairseq's additive masks, right-padded
    targets, training mode without dropout: the largest |log p| difference at the real positions."""
    torch.manual_seed(0)
    model = build_model(arch, ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0",
                               *OWN_SELF_ATTENTION[arch]], vocab_size=VOCAB).to(device=device, dtype=dtype).train()
    src, lengths, prev = (t.to(device) for t in right_padded_batch())
    out = {}
    for fused in (False, True):
        use_causal_kernel(model.decoder, fused)
        with torch.no_grad():
            out[fused] = model(src, lengths, prev)[0].float().log_softmax(-1)[prev.ne(1)]
    return (out[True] - out[False]).abs().max().item()


def fp32_islands(device: str, dtype: torch.dtype):
    """The MoE router's losses, the Gumbel-sigmoid samples, q(z = 1) and the KL stay fp32 in a
    half-precision model (docs/widenet.md, docs/latent_depth_transformer.md), in training mode."""
    torch.manual_seed(0)
    src, lengths, prev = (t.to(device) for t in batch())
    widenet = build_model("widenet_tiny", vocab_size=VOCAB).to(device=device, dtype=dtype).train()
    logits, extra = widenet(src, lengths, prev)
    assert logits.dtype == dtype and torch.isfinite(logits).all()
    assert all(loss.dtype == torch.float32 for loss in extra["moe_balance_loss"])
    latent = build_model("latent_depth_transformer_tiny", vocab_size=VOCAB).to(device=device, dtype=dtype).train()
    logits, extra = latent(src, lengths, prev)
    assert logits.dtype == dtype and torch.isfinite(logits).all()
    probs, samples = extra["latent_probs_decoder"][0], extra["latent_samples_decoder"][0]
    assert probs.dtype == samples.dtype == torch.float32 and probs.device.type == device
    assert bernoulli_kl(probs, 0.5).dtype == torch.float32


#: The tier's training flags (lr 0.005, inverse-sqrt with 100 warm-up updates, 4,096 tokens), less
#: ``--max-update`` and the precision.
TRAIN_FLAGS = ["--num-workers", "0", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.005",
               "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--max-tokens", "4096",
               "--label-smoothing", "0.1", "--seed", "1", "--log-format", "json", "--no-epoch-checkpoints",
               "--disable-validation"]
#: The tier's updates per precision: the checkpoints of fp16 and bf16 are decoded, so they train to
#: a model that translates (600 updates: 14.4 BLEU for multi-path in fp32); the memory-efficient fp16
#: and AMP trainings are only checked by :func:`check_training` (finite figures, a loss 1 bit lower,
#: the loss scale), for which the short schedule is enough: its warm-up and 100 updates after it.
UPDATES = {"fp16": 600, "bf16": 600, "memory_efficient_fp16": 200, "amp": 200}
LOG_INTERVAL = 25
#: fairseq-generate's flags that decode the first of two shards of a set's batches (every other
#: batch of 128 sentences: 512 of test_2016's 1,000), scored with ``corpus_bleu(..., part=True)``.
DECODE_HALF = ["--distributed-world-size", "2", "--distributed-rank", "0"]


def check_training(stats: list):
    """Every logged figure finite, the mean loss of the last 3 logs at least 1 below that of the first
    3, and an fp16 loss scale never under 1 (fairseq starts at 128 and stops at --min-loss-scale 1e-4:
    a scale under 1 means the gradients overflowed fp16 over and over). Returns (losses, scales)."""
    for record in stats:
        for key, value in record.items():
            assert math.isfinite(value), f"{key} = {value} at {record}"
    losses = [r["loss"] for r in stats]
    scales = [r["loss_scale"] for r in stats if "loss_scale" in r]  # bf16 needs no loss scale
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.0, losses
    assert min(scales, default=1.0) >= 1.0, scales
    return losses, scales
