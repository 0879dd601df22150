"""A configuration the plugin refuses (an architecture's, a criterion's or a task's flag) ends
fairseq's programs as their own argument errors end: one line ``<program>: error: <message>``, exit
status 2, no traceback; the message is the one the hub and scripts get as a ``ConfigurationError``
(fairseq_widearch/validation.py)."""
import subprocess

import pytest
from fairseq import options, tasks

from fairseq_widearch.fairseq_fixes import training_criterion_error
from fairseq_widearch.validation import ConfigurationError
from testing_utils import (
    BIN,
    REPO,
    TINY_CASES,
    TRAIN_FLAGS,
    criterion_for,
    dummy_translation_data,
    fairseq,
    hydra_config,
    launch,
)

PLUGIN = str(REPO / "fairseq_widearch")
#: Heads that divide none of the tiny presets' widths: every architecture refuses them.
HEADS = ["--encoder-attention-heads", "3"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return dummy_translation_data(tmp_path_factory.mktemp("refusals"))


def trains(data, arch, *flags) -> list:
    return [str(a) for a in [data, "--user-dir", PLUGIN, "--arch", arch, *criterion_for(arch), *TINY_CASES[arch],
                             *TRAIN_FLAGS, "--max-update", 1, *flags]]


def refused_here(args) -> str:
    """The message of the ``ConfigurationError`` that building fairseq-train's ``args``' model raises
    outside a fairseq program."""
    parsed = options.parse_args_and_arch(options.get_training_parser(), args)
    with pytest.raises(ConfigurationError) as refused:
        tasks.setup_task(parsed).build_model(parsed)
    return str(refused.value)


def ends_in_one_line(out, program, message):
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.rstrip("\n").splitlines()[-1] == f"{program}: error: {message}"


def ended_in_this_process(out, program, message):
    """In this process an exit status reads "<launcher> exited N", the tool's stderr after it."""
    assert "exited 2" in out.stderr and out.stderr.rstrip("\n").endswith(f"{program}: error: {message}"), out.stderr


@pytest.mark.parametrize("launcher,program", [("fairseq-train", "fairseq-train"), ("python -m fairseq_cli.train", "train.py")])
@pytest.mark.parametrize("arch", sorted(TINY_CASES))
def test_each_architectures_refusal_ends_fairseq_train_in_its_message_alone(arch, launcher, program, data, tmp_path):
    args = trains(data, arch, *HEADS, "--save-dir", tmp_path)
    message = refused_here(args)
    assert "--encoder-attention-heads" in message
    ended_in_this_process(launch(launcher, *args), program, message)


def test_a_script_calling_fairseq_trains_main_gets_the_error_not_an_exit(data, tmp_path):
    """Only a program's entry point (``cli_main``) ends in one line; ``fairseq_cli.train.main`` called
    by a script raises, as the hub does."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train as fairseq_train

    args = trains(data, "multipath_transformer_tiny", *HEADS, "--save-dir", tmp_path)
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), args))
    with pytest.raises(ConfigurationError, match="--encoder-attention-heads 3"):
        fairseq_train.main(cfg)


def test_a_task_refusal_ends_fairseq_hydra_train_in_one_line(data, tmp_path):
    args = [str(a) for a in [data, "--user-dir", PLUGIN, "--arch", "transformer_tiny", "--task", "scalable_translation",
                             "--criterion", "scalable_self_distillation", *TRAIN_FLAGS, "--max-update", 1,
                             "--save-dir", tmp_path]]
    ended_in_this_process(launch("fairseq-hydra-train", *args, tmp_path=tmp_path), "fairseq-hydra-train",
                          "--task scalable_translation needs a scalable_transformer arch, not 'transformer_tiny'")


def test_a_tasks_criterion_refusal_ends_fairseq_train_before_its_first_batch(data, tmp_path):
    """The scalable task trains with its own criterion: refused when the trainer is built, not at the
    first training step."""
    args = [str(a) for a in [data, "--user-dir", PLUGIN, "--arch", "scalable_transformer_tiny", "--task",
                             "scalable_translation", "--criterion", "label_smoothed_cross_entropy", *TRAIN_FLAGS,
                             "--max-update", 1, "--save-dir", tmp_path]]
    message = ("--task scalable_translation trains with --criterion scalable_self_distillation (its --distill-stage 1 "
               "is label-smoothed CE for every sub-Transformer), not --criterion label_smoothed_cross_entropy")
    parsed = options.parse_args_and_arch(options.get_training_parser(), args)
    task = tasks.setup_task(parsed)
    assert training_criterion_error(task, None, task.build_criterion(parsed)) == message  # what the trainer asks
    ended_in_this_process(launch("fairseq-train", *args), "fairseq-train", message)


def run(program, *args, cwd=None):
    return subprocess.run([str(BIN / program), *map(str, args)], capture_output=True, text=True, timeout=600,
                          cwd=cwd)


@pytest.mark.slow
def test_the_programs_end_a_refusal_in_one_line_in_their_own_processes(data, tmp_path):
    """fairseq-train on a criterion that drops WideNet's balance loss, fairseq-hydra-train (which
    imports the plugin only once its main runs) on a criterion's value out of range, fairseq-generate on a
    width the scalable model does not have."""
    out = run("fairseq-train", *trains(data, "widenet_tiny", "--criterion", "label_smoothed_cross_entropy",
                                       "--save-dir", tmp_path / "widenet"))
    ends_in_one_line(out, "fairseq-train", "--criterion label_smoothed_cross_entropy leaves out WideNet's balance loss "
                     "(Xue et al. 2022, Eq. 8), part of the training objective: train with --criterion "
                     "moe_label_smoothed_cross_entropy")
    args = trains(data, "latent_depth_transformer_tiny", "--latent-target-layers", -1, "--save-dir", tmp_path / "hydra")
    out = run("fairseq-hydra-train", *hydra_config(args, tmp_path), cwd=tmp_path)
    ends_in_one_line(out, "fairseq-hydra-train", "--latent-target-layers must be >= 0, got -1")

    scalable = trains(data, "scalable_transformer_tiny", "--lambda2-anneal-updates", 1, "--save-dir", tmp_path / "scalable")
    fairseq("train", *scalable)
    out = run("fairseq-generate", data, "--user-dir", PLUGIN, "--task", "scalable_translation", "--eval-width", 100,
              "--path", tmp_path / "scalable" / "checkpoint_last.pt", "--cpu", "--gen-subset", "test")
    ends_in_one_line(out, "fairseq-generate", refused_here([*scalable, "--eval-width", "100"]))
