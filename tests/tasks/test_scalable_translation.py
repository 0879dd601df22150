"""scalable_translation + scalable_self_distillation (Gao et al. 2021, Sec. 3.3, Eqs. 6-9): seeded
sub-Transformer draws, one backward per sub-Transformer giving the gradient of the whole
objective, the λ2 schedule (Eq. 8), and clear errors."""
import numpy as np
import pytest
import torch

from fairseq_widearch.criterions.scalable_self_distillation import ScalableSelfDistillationCriterion
from fairseq_widearch.model_builder import build_model, dummy_dictionary
from fairseq_widearch.tasks.scalable_translation import (
    ScalableTranslationConfig,
    ScalableTranslationTask,
    draw_sub_transformers,
)

VOCAB = 40
WIDTHS = list(range(256, 1025, 64))


def make_task(**cfg):
    d = dummy_dictionary(VOCAB)
    return ScalableTranslationTask(ScalableTranslationConfig(**{"seed": 1, **cfg}), d, d)


def make_sample():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB, (3, 7), generator=g)
    target = torch.randint(4, VOCAB, (3, 6), generator=g)
    target[0, 4:] = 1
    prev = torch.cat([torch.full((3, 1), 2), target[:, :-1]], 1)
    return {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([7, 7, 7]), "prev_output_tokens": prev},
            "target": target, "ntokens": int(target.ne(1).sum())}


def test_draws_depend_on_seed_and_update_only_and_updates_differ():
    """Ranks (and a resumed run) agree whatever else used the global RNGs (data order, dropout)."""
    np.random.seed(0), torch.manual_seed(0)
    rank0 = [draw_sub_transformers(WIDTHS, "type1", 1024, 12, 2, True, seed=7, update_num=j) for j in range(50)]
    np.random.seed(1), torch.manual_seed(1)
    rank1 = [draw_sub_transformers(WIDTHS, "type1", 1024, 12, 2, True, seed=7, update_num=j) for j in range(50)]
    assert rank0 == rank1
    assert all(draw[0] == (256, None) for draw in rank0)  # the narrowest, then one random width
    randoms = {draw[1][0] for draw in rank0}
    assert len(randoms) > 5 and randoms <= set(WIDTHS[1:-1])
    other_seed = [draw_sub_transformers(WIDTHS, "type1", 1024, 12, 2, True, seed=8, update_num=j) for j in range(50)]
    assert other_seed != rank0


def test_type2_draws_keep_c_at_m_max_and_draw_every_layer():
    draws = draw_sub_transformers(WIDTHS, "type2", 1024, 12, 3, True, seed=1, update_num=3)
    assert draws[0] == (1024, [256] * 12)
    assert all(c == 1024 and len(dims) == 12 and set(dims) <= set(WIDTHS) for c, dims in draws)
    assert len({tuple(dims) for _, dims in draws[1:]}) == 2
    assert all(c != 256 for c, _ in draw_sub_transformers(WIDTHS, "type1", 1024, 12, 4, False, 1, 0))


def test_lambda2_schedule_of_eq8():
    task = make_task()
    stage2 = ScalableSelfDistillationCriterion(task, False, 0.1, distill_stage=2, lambda2_anneal_updates=100)
    assert [stage2.mixing_weight(j) for j in (0, 50, 99, 100, 1000)] == [1.0, 0.75, 1 - 0.5 * 99 / 100, 0.5, 0.5]
    assert ScalableSelfDistillationCriterion(task, False, 0.1, distill_stage=2, max_update=300).mixing_weight(50) == 0.75
    assert ScalableSelfDistillationCriterion(task, False, 0.1, distill_stage=1).mixing_weight(5) == 1.0
    assert ScalableSelfDistillationCriterion(task, False, 0.1, distill_stage=3).mixing_weight(5) == 0.9


@pytest.mark.parametrize("kwargs,message", [
    (dict(distill_stage=4), "--distill-stage must be 1, 2 or 3, got 4"),
    (dict(distill_stage=3, lambda3=1.5), "--lambda3 must be in \\[0, 1\\], got 1.5"),
    (dict(distill_stage=2), "--distill-stage 2 needs t_j: set --lambda2-anneal-updates or --max-update"),
])
def test_bad_criterion_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ScalableSelfDistillationCriterion(make_task(), False, 0.1, **kwargs)


class BackwardCounter:
    def __init__(self):
        self.calls = 0

    def backward(self, loss):
        self.calls += 1
        loss.backward()


@pytest.mark.parametrize("stage", [1, 2])
def test_one_backward_per_sub_transformer_gives_the_gradient_of_the_whole_objective(stage):
    """Eq. 6 / Eq. 7 at j = 5 of t_j = 10 (λ2 = 0.75), widest + narrowest + one random."""
    torch.manual_seed(0)
    model = build_model("scalable_transformer_tiny", ["--dropout", "0", "--scalable-widths", "64,128"],
                        vocab_size=VOCAB)
    task = make_task(num_sub_transformers=2)
    criterion = ScalableSelfDistillationCriterion(task, False, 0.1, distill_stage=stage, lambda2_anneal_updates=10)
    sample, optimizer = make_sample(), BackwardCounter()
    loss, sample_size, log = task.train_step(sample, model, criterion, optimizer, update_num=5)
    assert optimizer.calls == 3 and sample_size == sample["ntokens"]
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    # the same objective written out in one graph
    target, keep = sample["target"].view(-1), sample["target"].view(-1).ne(1)

    def run(width):
        model.set_sample_config(width)
        return model.get_normalized_probs(model(**sample["net_input"]), log_probs=True).view(-1, VOCAB)

    def smoothed(lprobs):
        nll = -lprobs.gather(1, target[:, None]).squeeze(1)
        return ((1 - 0.1 - 0.1 / (VOCAB - 1)) * nll - 0.1 / (VOCAB - 1) * lprobs.sum(-1))[keep].sum()

    widest = run(128)
    teacher = widest.detach().exp()
    weight = 1.0 if stage == 1 else 0.75
    total = smoothed(widest)
    for _ in range(2):  # both sub-Transformers are the narrowest width when M = {64, 128}
        narrow = run(64)
        total = total + weight * smoothed(narrow) + (1 - weight) * -(teacher * narrow).sum(-1)[keep].sum()
    total.backward()
    torch.testing.assert_close(loss, total.detach(), rtol=1e-5, atol=1e-4)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert ("distill_loss" in log) == (stage == 2) and log["distill_lambda"] == weight


def test_eval_width_and_bad_values_name_the_flag():
    model = build_model("scalable_transformer_tiny", vocab_size=VOCAB)
    make_task(eval_width="64").eval_sub_transformer(model)
    assert model.encoder.width == 64 and model.decoder.layers[1].self_attn.active_dim == 64
    make_task(eval_width="64,128,128,64").eval_sub_transformer(model)
    assert model.encoder.width == 128 and [layer.self_attn.active_dim for layer in model.all_layers()] == [64, 128, 128, 64]
    for value, message in [("96", "multiples of 64"), ("64,128", "needs 4 widths"), ("256", "got 256"),
                           ("x", "invalid literal")]:
        with pytest.raises(ValueError, match=f"--eval-width '{value}': .*{message}"):
            make_task(eval_width=value).eval_sub_transformer(model)


def test_training_with_another_criterion_fails_naming_the_flag():
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
    model = build_model("scalable_transformer_tiny", vocab_size=VOCAB)
    task = make_task()
    with pytest.raises(ValueError, match="scalable_self_distillation .* not --criterion label_smoothed_cross_entropy"):
        task.train_step(make_sample(), model, LabelSmoothedCrossEntropyCriterion(task, False, 0.1), BackwardCounter(), 0)


@pytest.mark.parametrize("task_class, exported, warned", [
    ("translation", False, True), ("scalable_translation", False, False), ("translation", True, False)])
def test_a_task_that_trains_only_the_widest_says_so(caplog, task_class, exported, warned):
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    from fairseq_widearch.model_builder import parse_arch_args

    d = dummy_dictionary(VOCAB)
    task = make_task() if task_class == "scalable_translation" else TranslationTask(TranslationConfig(), d, d)
    export = ["--exported-width", "64", "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
              "--encoder-attention-heads", "1", "--decoder-attention-heads", "1"]  # as export_subnet writes it
    args = parse_arch_args("scalable_transformer_tiny", export if exported else [])
    with caplog.at_level("WARNING", logger="fairseq_widearch.models.scalable_transformer"):
        task.build_model(args)
    assert ("trains and decodes only the widest sub-Transformer (width 128)" in caplog.text) == warned
