"""latent_depth_transformer (Li et al. 2020): Eq. 2 against fairseq's pre- and post-norm Transformer,
deterministic inference, skipped layers, Table 1 presets, config errors."""
import re

import pytest
import torch

from fairseq_widearch.experiments.counting import preset_param_counts
from fairseq_widearch.model_builder import build_model, dummy_dictionary

VOCAB = 40
FLAGS = ["--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4", "--encoder-layers", "2", "--decoder-layers", "3"]


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (3, 7), generator=g)
    src[0, :2] = 1
    prev = torch.randint(4, VOCAB, (3, 6), generator=g)
    prev[:, 0] = 2
    return src, torch.tensor([5, 7, 7]), prev


def latent_model(*flags):
    return build_model("latent_depth_transformer_tiny", list(flags), src_dict=dummy_dictionary(VOCAB))


def stock_prenorm(decoder_layers=3):
    flags = [f if f != "3" else str(decoder_layers) for f in FLAGS]
    return build_model("transformer", flags + ["--encoder-normalize-before", "--decoder-normalize-before",
                                                "--share-decoder-input-output-embed"],
                       src_dict=dummy_dictionary(VOCAB)).eval()


def set_logits(model, encoder, decoder):
    with torch.no_grad():
        model.encoder.layer_select.logits[0] = torch.tensor(encoder)
        model.decoder.layer_select.logits[0] = torch.tensor(decoder)


def test_every_layer_selected_equals_fairseq_prenorm_transformer():
    torch.manual_seed(0)
    model = latent_model("--latent-inference", "hard").eval()
    set_logits(model, [9.0, 9.0], [9.0, 9.0, 9.0])  # z = 1 everywhere
    stock = stock_prenorm()
    missing, unexpected = stock.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all("layer_select" in key for key in unexpected)  # same parameter names
    src, lengths, prev = batch()
    with torch.no_grad():
        (ours, extra), (theirs, stock_extra) = model(src, lengths, prev), stock(src, lengths, prev)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(extra["attn"][0], stock_extra["attn"][0], atol=1e-6, rtol=1e-5)  # alignments


POST_NORM = {"encoder_normalize_before": False, "decoder_normalize_before": False}


def test_post_norm_latent_model_with_every_layer_selected_equals_fairseqs_post_norm_transformer():
    """The released example's regime (``multilingual_transformer_iwslt_de_en`` is post-norm)."""
    torch.manual_seed(0)
    model = build_model("latent_depth_transformer_tiny", ["--latent-inference", "hard"],
                        src_dict=dummy_dictionary(VOCAB), **POST_NORM).eval()
    set_logits(model, [9.0, 9.0], [9.0, 9.0, 9.0])
    stock = build_model("transformer", FLAGS + ["--share-decoder-input-output-embed"],
                        src_dict=dummy_dictionary(VOCAB)).eval()
    missing, unexpected = stock.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all("layer_select" in key for key in unexpected)
    src, lengths, prev = batch()
    with torch.no_grad():
        (ours, extra), (theirs, stock_extra) = model(src, lengths, prev), stock(src, lengths, prev)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(extra["attn"][0], stock_extra["attn"][0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("norm", [{}, POST_NORM], ids=["pre-norm", "post-norm"])
def test_a_decoder_layer_in_training_scales_each_branch_by_z(norm):
    """Training mode with dropout: z = 1 gives fairseq's own layer (the same dropout draws), z = 0
    the identity pre-norm and the three LayerNorms post-norm (the released residual_connection)."""
    from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
    model = build_model("latent_depth_transformer_tiny", ["--dropout", "0.3", "--attention-dropout", "0.2",
                                                          "--activation-dropout", "0.1"], vocab_size=VOCAB, **norm)
    layer = model.decoder.layers[0].train()
    x, enc = torch.randn(5, 2, 32), torch.randn(4, 2, 32)
    outputs = {}
    for name, z in (("fairseq", None), ("z=1", torch.tensor(1.0)), ("z=0", torch.tensor(0.0))):
        torch.manual_seed(1)
        if z is None:
            outputs[name] = TransformerDecoderLayerBase.forward(layer, x, enc, None)[0]
        else:
            outputs[name] = layer(x, enc, None, None, None, None, False, z)[0]
    torch.testing.assert_close(outputs["z=1"], outputs["fairseq"])
    chain = layer.final_layer_norm(layer.encoder_attn_layer_norm(layer.self_attn_layer_norm(x)))
    torch.testing.assert_close(outputs["z=0"], chain if norm else x)


@pytest.mark.parametrize("norm, computed", [({}, 0), (POST_NORM, 1)], ids=["pre-norm", "post-norm"])
def test_hard_selection_computes_a_deselected_post_norm_layer(norm, computed):
    """Pruning a z = 0 layer is exact pre-norm only; post-norm its LayerNorms still apply."""
    model = build_model("latent_depth_transformer_tiny", ["--latent-inference", "hard"],
                        src_dict=dummy_dictionary(VOCAB), **norm).eval()
    set_logits(model, [9.0, 9.0], [9.0, -9.0, 9.0])
    calls = []
    model.decoder.layers[1].register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        model(*batch())
    assert len(calls) == computed


def test_alignment_layer_deselected_by_hard_selection_falls_back_to_the_last_computed_layer():
    torch.manual_seed(0)
    model = latent_model("--latent-inference", "hard").eval()
    set_logits(model, [9.0, 9.0], [9.0, 9.0, -9.0])  # the last decoder layer (the default alignment layer) skipped
    pruned = stock_prenorm(decoder_layers=2)
    pruned.load_state_dict({k: v for k, v in model.state_dict().items() if "layers.2." not in k}, strict=False)
    src, lengths, prev = batch()
    with torch.no_grad():
        torch.testing.assert_close(model(src, lengths, prev)[1]["attn"][0], pruned(src, lengths, prev)[1]["attn"][0],
                                   atol=1e-6, rtol=1e-5)


def test_hard_selection_skips_deselected_layers_like_a_pruned_model():
    torch.manual_seed(0)
    model = latent_model("--latent-inference", "hard").eval()
    set_logits(model, [9.0, 9.0], [9.0, -9.0, 9.0])  # decoder layer 1 deselected
    state = {}
    for key, value in model.state_dict().items():  # keep decoder layers 0 and 2 as 0 and 1
        match = re.match(r"decoder\.layers\.(\d+)\.(.*)", key)
        if match is None:
            state[key] = value
        elif match[1] != "1":
            state[f"decoder.layers.{0 if match[1] == '0' else 1}.{match[2]}"] = value
    pruned = stock_prenorm(decoder_layers=2)
    pruned.load_state_dict(state, strict=False)
    src, lengths, prev = batch()
    with torch.no_grad():
        torch.testing.assert_close(model(src, lengths, prev)[0], pruned(src, lengths, prev)[0], atol=1e-5, rtol=1e-5)


def test_inference_is_deterministic_and_training_samples():
    torch.manual_seed(0)
    model = latent_model()
    src, lengths, prev = batch()
    model.eval()
    with torch.no_grad():
        first, second = model(src, lengths, prev), model(src, lengths, prev)
    assert torch.equal(first[0], second[0])
    torch.testing.assert_close(first[1]["latent_samples_decoder"][0], torch.full((1, 3), 0.5))  # soft: q(z=1)
    model.train()
    samples = model(src, lengths, prev)[1]["latent_samples_encoder"][0]
    assert ((samples > 0) & (samples < 1)).all() and not torch.allclose(samples, torch.full((1, 2), 0.5))


def test_schedules_advance_through_set_num_updates():
    model = latent_model("--latent-soft-updates", "5")
    model.set_num_updates(7)
    assert model.encoder.layer_select.num_updates == 7 and model.decoder.layer_select.num_updates == 7
    model.train()
    z = model(*batch())[1]["latent_samples_decoder"][0]
    assert set(z.flatten().tolist()) <= {0.0, 1.0}  # straight-through hard samples after --latent-soft-updates


def test_decoder_only_latent_layers_keep_fairseqs_encoder():
    model = build_model("latent_depth_transformer", FLAGS, vocab_size=VOCAB)
    assert type(model.encoder).__name__ == "TransformerEncoderBase"
    assert "latent_samples_decoder" in model(*batch())[1]


# Table 1 (WMT16 En-De): d = 512, FFN 1024, separate vocabularies of ~33k types, tied decoder embeddings.
TABLE1_PARAMS = {"lld_12_24": 135, "lld_12_48": 211, "llboth_36_36": 224, "llboth_48_48": 287, "llboth_64_64": 371}


@pytest.mark.slow
@pytest.mark.parametrize("preset,paper", sorted(TABLE1_PARAMS.items()))
def test_table1_preset_parameter_counts_within_3_percent(preset, paper):
    stats = preset_param_counts(f"latent_depth_transformer_{preset}", vocab_size=33000)
    assert abs(stats["params"] / 1e6 - paper) / paper < 0.03, stats


@pytest.mark.parametrize("flags,overrides,message", [
    (["--latent-threshold", "1.5"], {}, "--latent-threshold must be in (0, 1), got 1.5"),
    ([], {"encoder_latent_layer": False, "decoder_latent_layer": False},
     "needs --encoder-latent-layer and/or --decoder-latent-layer"),
    (["--latent-temperature", "0"], {}, "--latent-temperature and --latent-min-temperature must be > 0"),
])
def test_invalid_configs_fail_at_build_time_naming_the_flag(flags, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_model("latent_depth_transformer_tiny", flags, vocab_size=VOCAB, **overrides)


# --- criterion: latent_depth_label_smoothed_cross_entropy (Eq. 8) ---
from types import SimpleNamespace  # noqa: E402

from fairseq_widearch.criterions import LatentDepthCriterion  # noqa: E402
from testing_utils import REPO, train  # noqa: E402


def criterion(**kw):
    """The criterion under Eq. 8 as printed (``ours``) unless ``kw`` names another objective."""
    kw = {"latent_objective": "ours", **kw}
    return LatentDepthCriterion(SimpleNamespace(target_dictionary=dummy_dictionary(VOCAB)), False, 0.1, **kw)


def extra(probs, samples, num_updates=0.0):
    """One posterior (bilingual): probs and samples are per layer lists."""
    return {"latent_probs_decoder": [torch.tensor([probs])], "latent_samples_decoder": [torch.tensor([samples])],
            "latent_num_updates": [torch.tensor(num_updates)]}


def test_kl_against_a_beta_prior_matches_its_closed_form():
    q, a, b = torch.tensor([0.9, 0.2, 0.5]), 3.0, 1.0
    p = a / (a + b)
    closed_form = (q * torch.log(q / p) + (1 - q) * torch.log((1 - q) / (1 - p))).sum()
    aux, stats = criterion(latent_prior="beta", latent_prior_beta="3,1").auxiliary(
        extra(q.tolist(), [1.0, 0.0, 1.0]), torch.zeros(()), None)
    torch.testing.assert_close(stats["latent_kl"], closed_form)
    torch.testing.assert_close(aux, closed_form)  # β = 1, no annealing, no target depth


def test_kl_annealing_and_target_depth_loss():
    crit = criterion(latent_kl_weight=2.0, latent_kl_anneal_updates=100, latent_target_layers=1,
                     latent_depth_weight=0.5)
    half, stats = crit.auxiliary(extra([0.5, 0.5, 0.5], [1.0, 0.0, 1.0], num_updates=50.0), torch.zeros(()), None)
    assert stats["latent_depth_loss"].item() == 1.0 and stats["latent_depth_decoder"].item() == 2.0  # (2 - 1)^2
    assert stats["latent_kl"].item() == pytest.approx(0.0, abs=1e-6)  # q = uniform prior
    assert half.item() == pytest.approx(0.0, abs=1e-6)  # L_K waits for the end of the KL ramp
    done, _ = crit.auxiliary(extra([0.9, 0.5, 0.5], [1.0, 0.0, 1.0], num_updates=100.0), torch.zeros(()), None)
    kl = (0.9 * torch.log(torch.tensor(1.8)) + 0.1 * torch.log(torch.tensor(0.2))).item()
    assert done.item() == pytest.approx(2.0 * kl + 0.5 * 1.0, rel=1e-4)
    ramp, _ = crit.auxiliary(extra([0.9, 0.5, 0.5], [1.0, 0.0, 1.0], num_updates=25.0), torch.zeros(()), None)
    assert ramp.item() == pytest.approx(0.25 * 2.0 * kl, rel=1e-4)


@pytest.mark.parametrize("kw,message", [
    (dict(latent_target_layers=4), "--latent-target-layers 4 exceeds the 3 latent layers of the decoder"),
    (dict(latent_prior_beta="3"), "--latent-prior-beta must be 'a,b' with a, b > 0"),
])
def test_criterion_config_errors(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        criterion(**kw).auxiliary(extra([0.5] * 3, [1.0] * 3), torch.zeros(()), None)


@pytest.mark.slow
def test_criterion_end_to_end_logs_every_term(multi30k_bin, tmp_path):
    log = train(multi30k_bin, tmp_path, "latent_depth_transformer_tiny", "--criterion",
                "latent_depth_label_smoothed_cross_entropy", "--latent-target-layers", "2", max_update=3).stdout
    line = [ln for ln in log.splitlines() if "| train |" in ln][-1]
    for key in ("ce_loss", "latent_kl", "latent_depth_loss", "latent_depth_encoder", "latent_depth_decoder"):
        assert f"{key} " in line, line


# --- multilingual: one posterior per language pair (Sec. 2.2, Eq. 7) ---
PAIRS = {"latent_lang_pairs": "en-de,en-fr", "latent_pair_langtoks": "__de__,__fr__"}


def multilingual_model(*flags):
    d = dummy_dictionary(VOCAB)
    for tok in ("__de__", "__fr__"):
        d.add_symbol(tok)
    model = build_model("latent_depth_transformer_tiny", list(flags), src_dict=d, **PAIRS)
    with torch.no_grad():  # pair 0 keeps every layer, pair 1 drops encoder layer 0 and decoder layer 2
        model.encoder.layer_select.logits.copy_(torch.tensor([[4.0, 4.0], [-4.0, 4.0]]))
        model.decoder.layer_select.logits.copy_(torch.tensor([[4.0, 4.0, 4.0], [4.0, 4.0, -4.0]]))
    return model, d


def multilingual_batch(d):
    src, lengths, prev = batch()
    src[:, :2] = 1  # left padding, then the language token
    src[:, 2] = torch.tensor([d.index("__fr__"), d.index("__de__"), d.index("__fr__")])
    return src, torch.tensor([5, 5, 5]), prev


@pytest.mark.parametrize("inference", ["soft", "hard"])
def test_mixed_batch_equals_each_pair_alone(inference):
    torch.manual_seed(0)
    model, d = multilingual_model("--latent-inference", inference)
    model.eval()
    src, lengths, prev = multilingual_batch(d)
    with torch.no_grad():
        mixed, extra = model(src, lengths, prev)
        assert extra["latent_pair"][0].tolist() == [1, 0, 1]
        assert extra["latent_probs_decoder"][0].shape == (2, 3)
        for rows in ([0, 2], [1]):
            alone = model(src[rows], lengths[rows], prev[rows])[0]
            torch.testing.assert_close(mixed[rows], alone, atol=1e-5, rtol=1e-5)
        model.decoder.layer_select.logits[1] = 4.0  # pair 1 now keeps every layer too
        assert not torch.allclose(model(src, lengths, prev)[0][[0, 2]], mixed[[0, 2]])


def test_multilingual_beams_reorder_the_language_pairs():
    model, d = multilingual_model()
    src, lengths, _ = multilingual_batch(d)
    encoder_out = model.encoder(src, src_lengths=lengths)
    order = torch.tensor([2, 2, 1, 0])
    assert model.encoder.reorder_encoder_out(encoder_out, order)["latent_pair"][0].tolist() == [1, 1, 0, 1]


def test_multilingual_training_samples_one_z_per_pair():
    torch.manual_seed(0)
    model, d = multilingual_model()
    extra = model.train()(*multilingual_batch(d))[1]
    z = extra["latent_samples_decoder"][0]
    assert z.shape == (2, 3) and not torch.equal(z[0], z[1])


def test_kl_against_the_aggregated_posterior_weights_pairs_by_their_batch_share():
    q = torch.tensor([[0.9, 0.2], [0.5, 0.6]])
    prior = q.mean(0)
    kl = q * torch.log(q / prior) + (1 - q) * torch.log((1 - q) / (1 - prior))
    ex = {"latent_probs_decoder": [q], "latent_samples_decoder": [torch.tensor([[1.0, 0.0], [1.0, 1.0]])],
          "latent_num_updates": [torch.tensor(0.0)], "latent_pair": [torch.tensor([0, 1, 1, 1])]}
    aux, stats = criterion(latent_prior="aggregated").auxiliary(ex, torch.zeros(()), None)
    torch.testing.assert_close(stats["latent_kl"], 0.25 * kl[0].sum() + 0.75 * kl[1].sum())
    assert stats["latent_depth_decoder"].item() == 1.5  # u = (1, 0.5): samples averaged over the pairs
    with pytest.raises(ValueError, match="--latent-prior aggregated needs a multilingual model"):
        criterion(latent_prior="aggregated").auxiliary(extra([0.5] * 3, [1.0] * 3), torch.zeros(()), None)


@pytest.mark.slow
def test_unknown_prior_fails_naming_the_flag(multi30k_bin, tmp_path):
    with pytest.raises(AssertionError, match="--latent-prior: invalid choice: 'gaussian'"):
        train(multi30k_bin, tmp_path, "latent_depth_transformer_tiny", "--criterion",
              "latent_depth_label_smoothed_cross_entropy", "--latent-prior", "gaussian")


# --- sampled inference: one draw of training's z per sentence, for all its decoding steps ---
def sampled_model():
    model = latent_model("--latent-inference", "sampled", "--latent-soft-updates", "0").eval()
    model.set_num_updates(10)  # training drew straight-through hard samples by now
    return model


def test_sampled_inference_is_reproducible_for_a_seed_and_varies_with_it():
    model, (src, lengths, prev) = sampled_model(), batch()
    outputs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        with torch.no_grad():
            outputs.append(model(src, lengths, prev))
    (first, extra), (second, _), (other, _) = outputs
    assert torch.equal(first, second) and not torch.allclose(first, other)
    thirds = extra["latent_samples_decoder"][0] * 3  # the mean of 3 sentences' 0/1 draws
    torch.testing.assert_close(thirds, thirds.round())


def test_sampled_inference_keeps_each_sentences_layers_for_every_decoding_step_and_beam():
    model, (src, lengths, prev) = sampled_model(), batch()
    torch.manual_seed(0)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        noise = encoder_out["latent_noise_decoder"][0]
        assert noise.shape == (3, 3)
        beams = model.encoder.reorder_encoder_out(encoder_out, torch.tensor([0, 0, 1, 1, 2, 2]))
        assert torch.equal(beams["latent_noise_decoder"][0], noise.repeat_interleave(2, 0))  # beams share it
        full = model.decoder(prev, encoder_out=encoder_out)[0]
        state, steps = {}, []
        for t in range(prev.size(1)):
            steps.append(model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)[0])
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    z = model.decoder.layer_select.sentence_samples(noise)
    assert not (z == z[0]).all()  # the sentences did not all draw the same layers


def test_sampled_inference_needs_the_encoders_noise():
    model, (src, lengths, prev) = sampled_model(), batch()
    encoder_out = model.encoder(src, src_lengths=lengths)
    del encoder_out["latent_noise_decoder"]
    with pytest.raises(ValueError, match="sampled latent inference needs per-sentence noise for the decoder"):
        model.decoder(prev, encoder_out=encoder_out)


def test_a_bilingual_lld_checkpoint_decodes_sampled():
    """LL-D keeps fairseq's encoder, which cannot draw the sentences' noise: with --latent-inference
    sampled (e.g. --model-overrides at decoding) the encoder is the latent-depth one, with the
    same parameters, so a checkpoint trained with the stock encoder loads into it."""
    trained = build_model("latent_depth_transformer", FLAGS, vocab_size=VOCAB)
    sampled = build_model("latent_depth_transformer", FLAGS + ["--latent-inference", "sampled"], vocab_size=VOCAB)
    sampled.load_state_dict(trained.state_dict())  # strict: the same parameter names
    assert type(sampled.encoder).__name__ == "LatentDepthEncoder"
    extra = sampled.eval()(*batch())[1]
    assert extra["latent_samples_decoder"][0].shape == (1, 3)


def test_no_recipe_or_study_decodes_with_hard_selection():
    """Hard selection on an undecided posterior runs a depth training never sampled."""
    for path in [*REPO.glob("examples/**/*.sh"), *REPO.glob("examples/**/*.py")]:
        text = path.read_text()
        assert not re.search(r"""latent_inference['"]?\s*[:=]\s*['"]hard""", text), path


# --- the default: trained as the released example trains, per preset ---
def training_config(arch, *flags):
    """(s, objective, β, a, K, λ) as fairseq-train's parser and the arch preset give them."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    argv = ["data-bin", "--user-dir", str(REPO / "fairseq_widearch"), "--arch", arch, "--criterion",
            "latent_depth_label_smoothed_cross_entropy", *flags]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    c = cfg.criterion
    return (cfg.model.latent_soft_updates, c.latent_objective, c.latent_kl_weight, c.latent_kl_anneal_updates,
            c.latent_target_layers, c.latent_depth_weight)


@pytest.mark.parametrize("arch,expected", [
    ("latent_depth_transformer", (500, "released", 0.1, 5000, 3, 0.1)),  # LL-D, fairseq's 6 decoder layers
    ("latent_depth_transformer_lld_12_24", (500, "released", 0.1, 5000, 12, 0.1)),  # the README's 12 of 24
    ("latent_depth_transformer_o2m_12_24", (500, "released", 0.1, 5000, 12, 0.1)),
    ("latent_depth_transformer_llboth_36_36", (500, "released", 0.1, 5000, 18, 0.1)),
    ("latent_depth_transformer_multi30k", (19, "released", 0.1, 188, 3, 0.1)),  # warm-up 300 of 8,000
    ("latent_depth_transformer_tiny", (1, "released", 0.1, 2, 1, 0.1)),  # LL-Both 2/3: half the shallower
])
def test_each_preset_trains_as_the_released_example_at_its_budget_and_depth(arch, expected):
    assert training_config(arch) == expected


@pytest.mark.parametrize("arch", ["latent_depth_transformer_multi30k", "latent_depth_transformer_lld_12_24"])
def test_the_printed_objective_restores_the_former_defaults(arch):
    """--latent-objective ours: Eq. 8 with β = 1, no ramp, no target, relaxed samples throughout."""
    assert training_config(arch, "--latent-objective", "ours") == (-1, "ours", 1.0, 0, 0, 0.1)


def test_flags_the_user_gives_win_over_the_preset_schedule():
    flags = ["--latent-soft-updates", "7", "--latent-kl-anneal-updates", "50", "--latent-target-layers", "2",
             "--latent-kl-weight", "0.3", "--decoder-layers", "12"]
    assert training_config("latent_depth_transformer_multi30k", *flags) == (7, "released", 0.3, 50, 2, 0.1)
    assert training_config("latent_depth_transformer_multi30k", "--decoder-layers", "12")[4] == 6  # K follows depth


def test_a_config_stored_under_the_objective_s_former_name_builds_the_released_schedule():
    """Checkpoints trained before the objective was named ``released`` store ``anchor``; loading
    one runs the preset on its stored config."""
    from argparse import Namespace

    from fairseq.models import ARCH_CONFIG_REGISTRY
    args = Namespace(latent_objective="anchor")
    ARCH_CONFIG_REGISTRY["latent_depth_transformer_multi30k"](args)
    assert (args.latent_soft_updates, args.latent_kl_anneal_updates, args.latent_target_layers) == (19, 188, 3)


@pytest.mark.slow
def test_a_checkpoint_of_the_former_default_decodes_as_it_was_trained(multi30k_bin, tmp_path):
    """A model trained under the former defaults (Eq. 8, relaxed samples throughout: its checkpoint
    stores --latent-soft-updates -1) keeps them when loaded: its soft weights at inference are the
    mean of the relaxed samples it trained on, not σ(α), whatever the preset's schedule is now."""
    from fairseq import checkpoint_utils

    from fairseq_widearch.modules.layer_select import expected_relaxed_sample
    train(multi30k_bin, tmp_path, "latent_depth_transformer_tiny", "--latent-objective", "ours", max_update=2)
    [model], cfg = checkpoint_utils.load_model_ensemble([str(tmp_path / "checkpoint_last.pt")])
    select = model.decoder.layer_select
    assert cfg.model.latent_soft_updates == -1 and select.soft_updates == -1
    model.eval()
    with torch.no_grad():
        select.logits.fill_(2.0)
        torch.testing.assert_close(select(), expected_relaxed_sample(select.logits.float(), 5.0))
        assert not torch.allclose(select(), torch.sigmoid(select.logits.float()), atol=0.05)
