"""fairseq-hydra-train trains every architecture's Multi30k preset from examples/hydra/multi30k.yaml,
with the overrides its header gives (budget cut to two updates), in this process, and the preset's
settings of its criterion reach the criterion as under fairseq-train
(``fairseq_fixes.presets_reach_the_criterion``)."""
import dataclasses
from argparse import Namespace

import pytest
import torch
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
from fairseq.models import ARCH_CONFIG_REGISTRY

from fairseq_widearch.experiments.settings import criterion
from testing_utils import MULTI30K_PRESETS, REPO, fairseq


def hydra_train(data, save, preset, *overrides):
    """The YAML config's training of ``preset`` with its criterion (the scalable model's task), two
    updates -> the checkpoint."""
    scalable = preset.startswith("scalable")
    task = ["task._name=scalable_translation"] if scalable else []
    trained_by = "scalable_self_distillation" if scalable else criterion(preset.removesuffix("_multi30k"))
    fairseq("hydra-train", "--config-dir", REPO / "examples" / "hydra", "--config-name", "multi30k",
            f"task.data={data}", f"model._name={preset}", *task, f"criterion._name={trained_by}", *overrides,
            "optimization.max_update=2", "dataset.disable_validation=true", "common.cpu=true", f"checkpoint.save_dir={save}",
            f"hydra.run.dir={save / 'hydra'}")
    return torch.load(save / "checkpoint_last.pt", weights_only=False)


def set_by_the_preset(preset: str, criterion_name: str, **given) -> dict:
    """The criterion's fields as fairseq-train's one namespace ends with them: ``given`` (criterion
    flags), then the preset, which reads them and sets the ones left unset."""
    args = Namespace(**given)
    ARCH_CONFIG_REGISTRY[preset](args)
    fields = {f.name for f in dataclasses.fields(CRITERION_DATACLASS_REGISTRY[criterion_name])}
    return {k: v for k, v in vars(args).items() if k in fields and v is not None}


@pytest.mark.slow
@pytest.mark.parametrize("preset", MULTI30K_PRESETS)
def test_each_preset_trains_from_the_yaml_config(preset, multi30k_slice_bin, tmp_path, monkeypatch):
    monkeypatch.setenv("PWD", str(REPO))  # the config's paths are the repository root's
    saved = hydra_train(multi30k_slice_bin, tmp_path, preset)
    trained_by = saved["cfg"]["criterion"]["_name"]
    assert saved["optimizer_history"][-1]["num_updates"] == 2 and saved["cfg"]["model"]["_name"] == preset
    assert trained_by == ("scalable_self_distillation" if preset.startswith("scalable")
                          else criterion(preset.removesuffix("_multi30k")))
    assert saved["cfg"]["model"]["dropout"] == 0.1 and saved["cfg"]["criterion"]["label_smoothing"] == 0.1
    by_preset = set_by_the_preset(preset, trained_by)
    assert {k: saved["cfg"]["criterion"][k] for k in by_preset} == by_preset


@pytest.mark.slow
def test_the_preset_reads_the_criterions_settings_and_a_value_given_wins(multi30k_slice_bin, tmp_path, monkeypatch):
    """Latent depth's preset sets its schedule for the objective the criterion is given (Eq. 8 as
    printed: no ramp, no K, relaxed samples throughout), and a value given to the criterion stays."""
    monkeypatch.setenv("PWD", str(REPO))
    preset = "latent_depth_transformer_multi30k"
    saved = hydra_train(multi30k_slice_bin, tmp_path, preset, "+criterion.latent_objective=ours",
                        "+criterion.latent_kl_weight=0.5")
    expected = set_by_the_preset(preset, criterion(preset), latent_objective="ours", latent_kl_weight=0.5)
    assert {k: saved["cfg"]["criterion"][k] for k in expected} == expected
    assert expected["latent_kl_weight"] == 0.5 and expected["latent_target_layers"] == 0
    assert saved["cfg"]["model"]["latent_soft_updates"] == -1  # the model's share of the schedule
