"""Conformance suite: every architecture the plugin registers, through its `_tiny` preset."""
import re

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_widearch.model_builder import build_model
from testing_utils import (
    MULTI30K_PRESETS,
    PLUGIN_ARCHS,
    PLUGIN_MODELS,
    REPO,
    TINY_ARCHS,
    VOCAB,
    batch,
    ddp_train,
    fairseq,
    train,
)


def test_the_suite_covers_every_architecture_through_its_tiny_and_multi30k_presets():
    """An architecture without a `_tiny` preset (or one that disappears) fails here instead of
    silently shrinking every parametrized test below; the `_multi30k` one is the quick start's."""
    assert len(PLUGIN_ARCHS) >= 5 and all(arch in ARCH_MODEL_REGISTRY for arch in TINY_ARCHS)
    assert {ARCH_MODEL_REGISTRY[arch] for arch in TINY_ARCHS} == PLUGIN_MODELS
    assert [ARCH_MODEL_REGISTRY.get(preset) for preset in MULTI30K_PRESETS] == [ARCH_MODEL_REGISTRY[a] for a in TINY_ARCHS]


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_every_parameter_gets_a_finite_gradient(arch):
    torch.manual_seed(0)
    model = build_model(arch, vocab_size=VOCAB)
    src, lengths, prev = batch()
    logits, _ = model(src, lengths, prev)
    logits.float().log_softmax(-1).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_incremental_decoding_equals_full_decoding(arch):
    torch.manual_seed(0)
    model = build_model(arch, vocab_size=VOCAB).eval()
    src, lengths, prev = batch()
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        full = model.get_normalized_probs(model.decoder(prev, encoder_out=encoder_out), log_probs=True)
        state = {}
        steps = []
        for t in range(prev.size(1)):
            out = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
            steps.append(model.get_normalized_probs(out, log_probs=True))
        incremental = torch.cat(steps, dim=1)
    assert (full - incremental).abs().max().item() <= 1e-5


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_beam_reordering_of_the_decoding_cache(arch):
    """Reordering the cache among the beams of one sentence (beam search) equals decoding the
    reordered beams from scratch."""
    torch.manual_seed(0)
    model = build_model(arch, vocab_size=VOCAB).eval()
    src, lengths, prev = batch()
    src, lengths = src[1:2].expand(3, -1), lengths[1:2].expand(3)  # three beams of one sentence
    order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        state = {}
        for t in range(3):
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
        model.decoder.reorder_incremental_state_scripting(state, order)
        enc_r = model.encoder.reorder_encoder_out(enc, order)
        step = model.decoder(prev[order, :4], encoder_out=enc_r, incremental_state=state)[0]
        full = model.decoder(prev[order, :4], encoder_out=enc_r)[0][:, -1:]
    assert (step - full).abs().max().item() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_half_precision_forward_is_finite(arch, dtype):
    torch.manual_seed(0)
    model = build_model(arch, vocab_size=VOCAB).eval().to(dtype)
    src, lengths, prev = batch()
    with torch.no_grad():
        logits, _ = model(src, lengths, prev)
    assert logits.dtype == dtype
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_save_load_round_trip_gives_identical_outputs(arch, tmp_path):
    torch.manual_seed(0)
    model = build_model(arch, vocab_size=VOCAB).eval()
    path = tmp_path / "model.pt"
    torch.save({"model": model.state_dict()}, path)
    torch.manual_seed(1)  # a differently initialised copy
    other = build_model(arch, vocab_size=VOCAB).eval()
    other.load_state_dict(torch.load(path)["model"])
    src, lengths, prev = batch()
    with torch.no_grad():
        assert torch.equal(model(src, lengths, prev)[0], other(src, lengths, prev)[0])


@pytest.mark.slow
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_train_then_generate_on_real_data(arch, multi30k_bin, tmp_path):
    """fairseq-train --user-dir fairseq_widearch from the repo root, then fairseq-generate, then
    load_model_ensemble in this process: all through torch's weights-only loading."""
    save = tmp_path / "ckpt"
    log = train(multi30k_bin, save, arch, "--user-dir", "fairseq_widearch", cwd=REPO, max_update=4).stdout
    assert "num_updates 4" in log
    gen = fairseq("generate", multi30k_bin, "--user-dir", "fairseq_widearch", "--path",
                  save / "checkpoint_last.pt", "--gen-subset", "valid", "--max-sentences", "16", "--beam", "3",
                  "--max-len-b", "10", "--cpu", "--remove-bpe", "--print-alignment", cwd=REPO).stdout
    hyps = [line for line in gen.splitlines() if line.startswith("H-")]
    sources = [line for line in gen.splitlines() if line.startswith("S-")]
    assert len(hyps) == len(sources) == 1014  # every sentence of Multi30k val
    # --print-alignment: one hard alignment (source-target index pairs) per hypothesis
    alignments = re.findall(r"^A-\d+\t(.*)$", gen, re.M)
    assert len(alignments) == 1014 and all(re.fullmatch(r"(\d+-\d+ ?)+", a) for a in alignments if a)
    assert sum(bool(a) for a in alignments) > 1000
    models, cfg = checkpoint_utils.load_model_ensemble([str(save / "checkpoint_last.pt")])
    assert cfg.model.arch == arch and type(models[0]).__module__.startswith("fairseq_widearch")


#: WideNet with a router per routing block (only routing blocks own one). Every tiny preset trains
#: with two ranks in bf16 in tests/test_two_ranks.py and the GPU check's dry run, under both backends between them.
DDP_CASES = [("widenet_tiny", ["--widenet-router-per-block", "--widenet-routing-groups", "1"])]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["legacy_ddp", "pytorch_ddp"])
@pytest.mark.parametrize("arch,flags", DDP_CASES)
@pytest.mark.e2e
def test_two_rank_data_parallel_ends_with_identical_parameters(arch, flags, backend, multi30k_bin, tmp_path):
    """legacy_ddp (fairseq's CPU choice) and PyTorch's DDP (fairseq's GPU default, unused-parameter
    search off: a parameter outside the loss's graph fails the step)."""
    states, outs = ddp_train(multi30k_bin, tmp_path, arch, *flags, backend=backend)
    assert states[0].keys() == states[1].keys()
    for name in states[0]:
        assert torch.equal(states[0][name], states[1][name]), f"{name} differs between ranks"
    # the ranks really trained: parameters moved away from a fresh initialisation
    assert "num_updates 3" in outs[0]


def objective(model, src, lengths, prev):
    """Mean log-probability plus every auxiliary output that carries a gradient (balance losses,
    latent-layer posteriors and samples), so a lost auxiliary gradient shows."""
    logits, extra = model(src, lengths, prev)
    aux = [t.float().sum() for key, values in extra.items() if key not in ("attn", "inner_states")
           for t in values if isinstance(t, torch.Tensor) and t.requires_grad]
    return logits.float().log_softmax(-1).mean() + sum(aux)


@pytest.mark.parametrize("flag", ["--checkpoint-activations", "--offload-activations"])
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_activation_checkpointing_gives_the_same_loss_and_gradients(arch, flag):
    """fairseq's checkpoint_wrapper on every layer, in training mode with dropout (the recomputed
    forward must redraw the same dropout masks, router noise and Gumbel samples)."""
    results = []
    for argv in ([], [flag]):
        torch.manual_seed(0)
        model = build_model(arch, ["--dropout", "0.3", "--attention-dropout", "0.1", *argv], vocab_size=VOCAB).train()
        torch.manual_seed(1)
        loss = objective(model, *batch())
        loss.backward()
        results.append((loss, {name: p.grad for name, p in model.named_parameters()}))
        layers = [*model.encoder.layers, *model.decoder.layers]
        assert all(hasattr(layer, "precheckpoint_forward") == bool(argv) for layer in layers)
    (loss, grads), (loss_ckpt, grads_ckpt) = results
    assert torch.equal(loss, loss_ckpt)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[name], grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_alignment_is_the_cross_attention_of_the_alignment_layer(arch):
    """As fairseq's decoder: ``extra["attn"]`` holds the cross-attention weights of
    ``alignment_layer`` (default the last) averaged over its first ``alignment_heads`` heads,
    ``(B, tgt_len, src_len)``, rows summing to 1 and zero on source padding. In training only when
    something reads them: an explicit ``alignment_layer`` or ``alignments_in_training``."""
    torch.manual_seed(0)
    model = build_model(arch, ["--dropout", "0.1"], vocab_size=VOCAB).train()
    src, lengths, prev = batch()
    assert model(src, lengths, prev)[1]["attn"] == [None]
    asked = model(src, lengths, prev, alignment_layer=model.decoder.num_layers - 1)[1]["attn"][0]
    model.decoder.alignments_in_training = True
    read = model(src, lengths, prev)[1]["attn"][0]
    assert asked.shape == read.shape == (*prev.shape, src.size(1))
    model.eval()
    with torch.no_grad():
        last = model(src, lengths, prev)[1]["attn"][0]
        explicit = model(src, lengths, prev, alignment_layer=model.decoder.num_layers - 1)[1]["attn"][0]
        first = model(src, lengths, prev, alignment_layer=0)[1]["attn"][0]
        one_head = model(src, lengths, prev, alignment_heads=1)[1]["attn"][0]
    torch.testing.assert_close(last.sum(-1), torch.ones(prev.shape))
    assert (last[0, :, :2] == 0).all()  # sentence 0 has two padding positions on the left
    assert torch.equal(last, explicit)
    assert not torch.allclose(first, last) and not torch.allclose(one_head, last)


#: fairseq Transformer flags each architecture's own layers do not apply.
UNAPPLIED = [("multipath_transformer_tiny", ["--quant-noise-pq", "0.1"]),
             ("multipath_transformer_tiny", ["--cross-self-attention"]),
             ("widenet_tiny", ["--encoder-layerdrop", "0.1"]), ("widenet_tiny", ["--decoder-layerdrop", "0.1"]),
             ("widenet_tiny", ["--quant-noise-pq", "0.1"]), ("widenet_tiny", ["--cross-self-attention"]),
             ("latent_depth_transformer_tiny", ["--encoder-layerdrop", "0.1"]),
             ("latent_depth_transformer_tiny", ["--decoder-layerdrop", "0.1"]),
             ("latent_depth_transformer_tiny", ["--cross-self-attention"]),
             ("partialformer_tiny", ["--quant-noise-pq", "0.1"]), ("partialformer_tiny", ["--cross-self-attention"]),
             ("partialformer_tiny", ["--activation-fn", "gelu"]),
             ("scalable_transformer_tiny", ["--quant-noise-pq", "0.1"]),
             ("scalable_transformer_tiny", ["--cross-self-attention"])]


@pytest.mark.parametrize("arch,argv", UNAPPLIED)
def test_fairseq_flags_the_layers_do_not_apply_fail_at_build_naming_the_flag(arch, argv):
    with pytest.raises(ValueError, match=re.escape(argv[0])):
        build_model(arch, argv, vocab_size=VOCAB)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_full_context_alignment_drops_the_causal_mask_as_fairseq_does(arch):
    """fairseq's decoder with ``full_context_alignment`` lets every target position see the whole
    target prefix (alignment training); without it the first position ignores later tokens."""
    torch.manual_seed(0)
    model = build_model(arch, vocab_size=VOCAB).eval()
    src, lengths, prev = batch()
    changed = prev.clone()
    changed[:, -1] = (prev[:, -1] + 1 - 4) % (VOCAB - 4) + 4  # another real token at the last position
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        first = {full: [model.decoder(p, encoder_out=enc, full_context_alignment=full)[0][:, 0] for p in (prev, changed)]
                 for full in (False, True)}
    torch.testing.assert_close(*first[False])
    assert not torch.allclose(*first[True])
