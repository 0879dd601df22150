"""Each fix's guard (fairseq_widearch/fairseq_fixes.py): a check that the fix holds, run under a launcher
(testing_utils.launch) on 37 random sentence pairs per split made in this process
(testing_utils.dummy_translation_data). ``GUARDS`` maps each fix to its guard; ``MATRIX`` lists the
(fix, launcher) pairs the registry says a fix is tested under, less those guarded by a test elsewhere
that carries ``@pytest.mark.guards(fix, launcher)``; tests/test_fairseq_fixes.py runs the rows of
the launchers that run in this process, tests/test_fairseq_fixes_launched.py those of torchrun and
fairseq's spawn."""
import ast
import dataclasses
import math
import re
import shutil
from argparse import Namespace
from types import SimpleNamespace

import torch
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
from fairseq.models import ARCH_CONFIG_REGISTRY, MODEL_REGISTRY

from fairseq_widearch import fairseq_fixes
from fairseq_widearch.experiments.settings import plugin_archs
from fairseq_widearch.fairseq_fixes import DECODING, FIXES
from testing_utils import REPO, WORKERS, dummy_translation_data, fairseq, launch

PLUGIN = REPO / "fairseq_widearch"
#: The dummy data's split size and the batch size: 5 batches, the last of 5 sentences, which stock
#: fairseq drops (not a multiple of --required-batch-size-multiple 8).
SENTENCES, BATCH = 37, 8
ARCH = "multipath_transformer_tiny"


def trains(data, save, *flags, arch=ARCH, criterion="label_smoothed_cross_entropy"):
    return [data, "--user-dir", PLUGIN, "--arch", arch, "--criterion", criterion, "--optimizer", "adam",
            "--lr", "0.001", "--max-tokens", "1024", "--batch-size", BATCH, "--cpu", "--num-workers", "0", "--seed", "1",
            "--log-format", "simple", "--log-interval", "1", "--no-epoch-checkpoints", "--save-dir", save, *flags]


def updates(save) -> int:
    return torch.load(save / "checkpoint_last.pt", weights_only=False)["optimizer_history"][-1]["num_updates"]


class Runs:
    """The runs one launcher's guards read, each made once and kept (several guards read one)."""

    def __init__(self, launcher, tmp, data, checkpoint):
        self.launcher, self.tmp, self.data, self.checkpoint = launcher, tmp, data, checkpoint
        self.world = WORKERS if launcher in ("torchrun", "spawn") else 1
        self.kept = {}

    def run(self, key, *args, stdin=None):
        """``args`` run by the launcher once per ``key``: its output's text (stdout and stderr) and status."""
        if key not in self.kept:
            out = launch(self.launcher, *args, tmp_path=self.tmp, stdin=stdin)
            self.kept[key] = SimpleNamespace(text=out.stdout + out.stderr, returncode=out.returncode)
        return self.kept[key]

    def train(self, key, *flags, save=None, **kwargs):
        return self.run(key, *trains(self.data, save or self.tmp / key, *flags, **kwargs))

    def patience(self, stage):
        """A model that never improves (lr 0) under --patience 1: first to epoch 1, then resumed up to
        epoch 10, then that command again with --max-update at the updates it has (``self.finished``)."""
        flags = ["--lr", "0", "--patience", "1"]
        save = self.tmp / "patience"
        first = self.train("patience 1", *flags, "--max-epoch", 1, save=save)
        if stage == 1:
            return first
        resumed = self.train("patience 2", *flags, "--max-epoch", 10, save=save)
        if stage == 2:
            return resumed
        if "patience 3" not in self.kept:
            self.finished = updates(save)
        return self.train("patience 3", *flags, "--max-epoch", 10, "--max-update", self.finished, save=save)

    def decode(self, key, *flags, path=None):
        args = [self.data, "--user-dir", PLUGIN, "--path", path or self.checkpoint, "--source-lang", "en",
                "--target-lang", "de", "--batch-size", BATCH, "--beam", "1", "--max-len-b", "5", "--cpu", *flags]
        if self.launcher == "fairseq-interactive":
            return self.run(key, *args, "--buffer-size", BATCH, stdin=(self.data.parent / "test.en").read_text())
        return self.run(key, *args, "--gen-subset", "test")


def epochs(out) -> list:
    return sorted({int(n) for n in re.findall(r"end of epoch (\d+)", out.text)})


def training_summaries(out, epoch) -> list:
    """The logged summaries of training epoch ``epoch`` (one per group that trained it)."""
    return [line for line in out.text.splitlines() if f"epoch {epoch:03d} |" in line and "valid on" not in line]


def hypotheses(out) -> int:
    return len(re.findall(r"^H-\d+\t", out.text, re.M))


def truncated(checkpoint, tmp):
    cut = tmp / "truncated.pt"
    if not cut.exists():
        cut.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    return cut


# ---- each fix's guard: (the launcher's runs, pytest's monkeypatch) -> asserts ----

def guard_allow_fairseq_checkpoint_globals(runs, monkeypatch):
    """A checkpoint fairseq saved loads under torch's weights-only default: resumed, decoded."""
    if runs.launcher in DECODING:
        out = runs.decode("decoded")
        assert out.returncode == 0 and hypotheses(out) == SENTENCES, out.text[-3000:]
    else:
        out = runs.patience(2)
        assert out.returncode == 0 and "Loaded checkpoint" in out.text, out.text[-3000:]


def guard_name_unreadable_checkpoints(runs, monkeypatch):
    """A checkpoint cut short stops resuming or decoding with one message naming the file."""
    cut = truncated(runs.checkpoint, runs.tmp)
    out = (runs.decode("truncated", path=cut) if runs.launcher in DECODING
           else runs.train("truncated", "--restore-file", cut, "--max-update", 1))
    assert out.returncode != 0 and f"cannot read checkpoint {cut} (truncated or corrupted?)" in out.text, out.text[-3000:]


def guard_keep_last_batch(runs, monkeypatch):
    """Every sentence is batched: an epoch of 5 batches is 5 updates (stock: 4), decoding gives a
    hypothesis for each of the 37 sentences (stock: 32)."""
    if runs.launcher in DECODING:
        assert hypotheses(runs.decode("decoded")) == SENTENCES
    else:
        summary, = training_summaries(runs.patience(1), 1)
        assert f"num_updates {math.ceil(math.ceil(SENTENCES / BATCH) / runs.world)} |" in summary


def guard_require_auxiliary_criterion(runs, monkeypatch):
    """Every architecture with auxiliary losses (WideNet, latent depth), under a criterion that drops
    them, stops before its first update."""
    auxiliary = [(f"{arch}_tiny", MODEL_REGISTRY[arch].auxiliary_criterion) for arch in plugin_archs()
                 if MODEL_REGISTRY[arch].auxiliary_criterion]
    for arch, criterion in auxiliary[:1] if runs.world > 1 else auxiliary:  # (processes: one, for time)
        out = runs.train(arch, "--max-update", 1, arch=arch)
        assert out.returncode != 0 and f"train with --criterion {criterion}" in out.text, out.text[-3000:]
        assert not (runs.tmp / arch / "checkpoint_last.pt").exists()


def guard_resume_patience(runs, monkeypatch):
    """Interrupted after epoch 1 of --patience 1 and resumed, it stops after epoch 2 as the run
    uninterrupted does (stock: epochs 2 and 3, the first after resuming taken as the best)."""
    assert epochs(runs.patience(1)) == [1]
    assert epochs(runs.patience(2)) == [2]


def guard_finished_runs_stay_finished(runs, monkeypatch):
    """The command of a run that reached its --max-update, run again, trains nothing (stock: one more
    update, saved)."""
    out = runs.patience(3)
    assert out.returncode == 0 and "nothing to train: the checkpoint has" in out.text, out.text[-3000:]
    assert updates(runs.tmp / "patience") == runs.finished


def guard_amp_loss_scaler_flags(runs, monkeypatch):
    """--amp's scaler starts at --amp-init-scale and grows every --amp-scale-window updates."""
    built = []

    class Recorded(torch.cuda.amp.GradScaler):
        def __init__(self, **kwargs):
            built.append(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setattr(torch.cuda.amp, "GradScaler", Recorded)
    out = runs.train("amp", "--amp", "--amp-init-scale", 4, "--amp-scale-window", 50, "--max-update", 1,
                     "--disable-validation")
    assert out.returncode == 0 and built[-1] == {"init_scale": 4.0, "growth_interval": 50}, (built, out.text[-3000:])


def guard_bf16_without_tpu(runs, monkeypatch):
    """--bf16 trains without a TPU (stock: dies asking torch_xla for a device)."""
    out = runs.train("bf16", "--bf16", "--max-update", 1, "--disable-validation")
    assert out.returncode == 0 and updates(runs.tmp / "bf16") == 1, out.text[-3000:]


def guard_bf16_inference(runs, monkeypatch):
    """--bf16 decodes with bf16 parameters (stock: fp32)."""
    from fairseq.sequence_generator import SequenceGenerator
    seen, generate = [], SequenceGenerator.generate

    def recorded(self, models, *args, **kwargs):
        seen.append(next(models[0].parameters()).dtype)
        return generate(self, models, *args, **kwargs)

    monkeypatch.setattr(SequenceGenerator, "generate", recorded)
    out = runs.decode("bf16", "--bf16")
    assert out.returncode == 0 and set(seen) == {torch.bfloat16}, (seen, out.text[-3000:])


def guard_torchrun_joins_one_group(runs, monkeypatch):
    """torchrun's two workers train as one group: one progress log, each epoch ceil(5 / 2) updates."""
    out = runs.patience(1)
    assert out.text.count("initialized host") == WORKERS and len(training_summaries(out, 1)) == 1, out.text[-3000:]


def guard_bmuf_world_size(runs, monkeypatch):
    """--use-bmuf's config holds the job's world size (stock under torchrun: 1, never synchronising)."""
    out = runs.train("bmuf", "--use-bmuf", "--max-update", 1, "--disable-validation")
    saved = torch.load(runs.tmp / "bmuf" / "checkpoint_last.pt", weights_only=False)["cfg"]
    assert out.returncode == 0 and saved["bmuf"]["distributed_world_size"] == runs.world


def guard_pytorch_ddp_on_cpu(runs, monkeypatch):
    """CPU workers train under fairseq's default --ddp-backend, pytorch_ddp (stock: PyTorch refuses
    the device_ids fairseq gives a CPU module): the first patience run gives no --ddp-backend."""
    out = runs.patience(1)
    assert out.returncode == 0 and "'ddp_backend': 'pytorch_ddp'" in out.text, out.text[-3000:]


def guard_checkpoint_copies_are_atomic(runs, monkeypatch):
    """A copy to checkpoint_last.pt cut short (a kill in the middle of it) leaves the previous
    checkpoint_last.pt whole (stock: cut short, the next run cannot resume)."""
    save = runs.tmp / "copies"
    runs.train("copies 1", "--max-update", 1, "--disable-validation", save=save)

    def killed_halfway(src, dst, *args, **kwargs):
        with open(src, "rb") as source, open(dst, "wb") as target:
            target.write(source.read()[: 1000])
        raise OSError("killed during the copy")

    with monkeypatch.context() as patched:
        patched.setattr(shutil, "copyfile", killed_halfway)
        out = runs.train("copies 2", "--max-update", 2, "--save-interval-updates", 1, "--disable-validation", save=save)
    assert out.returncode != 0 and "killed during the copy" in out.text
    assert updates(save) == 1


def guard_prefetching_stops_at_exit(runs, monkeypatch):
    """A run stopped mid-epoch (--max-update 2 of 5 batches) leaves its prefetching threads to the exit
    handler, which ends them."""
    registered = []
    monkeypatch.setattr(fairseq_fixes, "_PREFETCHING", RecordingSet(registered))
    out = runs.train("prefetching", "--max-update", 2, "--disable-validation")
    assert out.returncode == 0 and registered and not any(thread.is_alive() for thread in registered)


class RecordingSet(set):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def add(self, item):
        self.seen.append(item)
        super().add(item)


def guard_help_lists_model_flags(runs, monkeypatch):
    """--help lists the flags of the architecture, criterion and task named beside it."""
    if runs.launcher in DECODING:
        out, listed = runs.run("help", "--user-dir", PLUGIN, "--task", "scalable_translation", "--help"), ["--eval-width"]
    else:
        out = runs.run("help", "--user-dir", PLUGIN, "--arch", "widenet_tiny", "--criterion",
                       "moe_label_smoothed_cross_entropy", "--help")
        listed = ["--moe-capacity-factor", "--moe-balance-weight"]
    assert out.returncode == 0 and [flag for flag in listed if flag not in out.text] == [], out.text[-3000:]


def guard_presets_reach_the_criterion(runs, monkeypatch):
    """Latent depth's preset sets its criterion's schedule under fairseq-hydra-train as in
    fairseq-train's one namespace (stock: the criterion's own defaults, which refuse to start)."""
    arch, criterion = "latent_depth_transformer_tiny", "latent_depth_label_smoothed_cross_entropy"
    out = runs.train("latent", "--max-update", 1, "--disable-validation", arch=arch, criterion=criterion)
    assert out.returncode == 0, out.text[-3000:]
    by_preset = Namespace()
    ARCH_CONFIG_REGISTRY[arch](by_preset)
    fields = {f.name for f in dataclasses.fields(CRITERION_DATACLASS_REGISTRY[criterion])}
    expected = {k: v for k, v in vars(by_preset).items() if k in fields and v is not None}
    saved = torch.load(runs.tmp / "latent" / "checkpoint_last.pt", weights_only=False)["cfg"]["criterion"]
    assert expected and {k: saved[k] for k in expected} == expected


GUARDS = {name[len("guard_"):]: function for name, function in globals().items() if name.startswith("guard_")}


def guarded_elsewhere() -> set:
    """The (fix, launcher) pairs of ``@pytest.mark.guards(fix, launcher)`` in the test files."""
    pairs = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "guards"
                    and all(isinstance(a, ast.Constant) for a in node.args)):
                pairs.add(tuple(a.value for a in node.args))
    return pairs


ELSEWHERE = guarded_elsewhere()
MATRIX = [(name, launcher) for name, fix_ in FIXES.items() for launcher in fix_.launchers
          if (name, launcher) not in ELSEWHERE]
#: The launchers whose rows run in processes of their own.
PROCESSES = ("torchrun", "spawn")




def dummy_runs(tmp_path_factory):
    """``launcher -> Runs`` on the dummy data and a checkpoint of 2 updates on it (fairseq-train in this process)."""
    tmp = tmp_path_factory.mktemp("dummy")
    data = dummy_translation_data(tmp)
    fairseq("train", *trains(data, tmp / "trained", "--max-update", 2, "--disable-validation"))
    kept = {}

    def get(launcher):
        if launcher not in kept:
            kept[launcher] = Runs(launcher, tmp_path_factory.mktemp(re.sub(r"\W+", "_", launcher)), data,
                                  tmp / "trained" / "checkpoint_last.pt")
        return kept[launcher]

    return get
