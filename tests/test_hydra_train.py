"""fairseq-hydra-train trains every architecture's Multi30k preset from examples/hydra/multi30k.yaml,
with the overrides its header gives (budget cut to two updates), in this process, and the preset's
settings of its criterion reach the criterion as under fairseq-train
(``fairseq_fixes.presets_reach_the_criterion``)."""
import dataclasses

import pytest
import torch
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY

from fairseq_widearch.experiments.settings import criterion
from fairseq_widearch.model_builder import parse_arch_args
from testing_utils import REPO, fairseq

PRESETS = ["multipath_transformer_multi30k", "widenet_multi30k", "scalable_transformer_multi30k",
           "latent_depth_transformer_multi30k", "partialformer_multi30k"]


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_trains_from_the_yaml_config(preset, multi30k_slice_bin, tmp_path, monkeypatch):
    monkeypatch.setenv("PWD", str(REPO))  # the config's paths are the repository root's
    scalable = preset.startswith("scalable")
    task = ["task._name=scalable_translation"] if scalable else []
    trained_by = "scalable_self_distillation" if scalable else criterion(preset.removesuffix("_multi30k"))
    fairseq("hydra-train", "--config-dir", REPO / "examples" / "hydra", "--config-name", "multi30k",
            f"task.data={multi30k_slice_bin}", f"model._name={preset}", *task, f"criterion._name={trained_by}",
            "optimization.max_update=2", "common.cpu=true", f"checkpoint.save_dir={tmp_path}",
            f"hydra.run.dir={tmp_path / 'hydra'}")
    saved = torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)
    assert saved["optimizer_history"][-1]["num_updates"] == 2
    assert saved["cfg"]["model"]["_name"] == preset and saved["cfg"]["criterion"]["_name"] == trained_by
    assert saved["cfg"]["model"]["dropout"] == 0.1 and saved["cfg"]["criterion"]["label_smoothing"] == 0.1
    fields = {f.name for f in dataclasses.fields(CRITERION_DATACLASS_REGISTRY[trained_by])}
    by_preset = {k: v for k, v in vars(parse_arch_args(preset)).items() if k in fields and v is not None}
    assert {k: saved["cfg"]["criterion"][k] for k in by_preset} == by_preset
    if preset.startswith("latent"):  # its training schedule is the criterion's
        assert {"latent_kl_anneal_updates", "latent_kl_weight", "latent_target_layers"} <= set(by_preset)
