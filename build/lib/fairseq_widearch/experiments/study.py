"""Each paper's central claim in miniature, every system trained to convergence (docs/claims.md).

    python -m fairseq_widearch.experiments.study --data BIN --bpe-codes CODES --ref REFERENCE [--work-dir runs/claims]
        [--claims multipath,widenet,scalable,latent_depth,partialformer] [--jobs 1] [--device cpu|cuda]
        [--max-epoch 40] [--patience 3] [--beam 5] [--max-len-b 200] [--results FILE] [--figures DIR]
        [--progress]

A claim is the paper's design and its own baselines, each the shared Multi30k body (d 128, FFN
512, 4 heads) changed the way the paper changes it. Every system trains with the comparison's
optimisation (``.settings.OPTIMISATION``: Adam (0.9, 0.98), lr 0.003,
inverse sqrt with 300 warm-up updates, label smoothing 0.1, dropout, attention and activation
dropout 0.1, 4,096 tokens per batch; the scalable claim keeps its paper's dropout by width on both
sides) until the validation loss has not improved for ``--patience`` epochs, at most
``--max-epoch``. The last 5 epoch checkpoints are averaged (all of them when fewer were trained),
and the average is scored: validation loss (label-smoothed, bits, ``fairseq-validate``) and
sacreBLEU on test_2016 (``fairseq-generate``, beam 5, length penalty 1.0).

Every run (claim, system, seed) is independent: its result, with its validation loss after every
epoch, is appended to ``--results`` (default ``WORK/results.jsonl``) and a run already there is
skipped, so that a results file kept apart from WORK (this project keeps its own in git,
``docs/data/claims.jsonl``) carries a study across machines. An interrupted run resumes from its
``checkpoint_last.pt`` (patience included: ``fairseq_widearch.fairseq_fixes.resume_patience``);
a system two claims share trains once (``Results.twin``). ``--jobs N`` runs N at
once (on a GPU many small runs share the device; on a CPU they share the cores, each run given
one N-th of them through ``OMP_NUM_THREADS`` unless that is set). Seed 1 comes
first; where the paper's design ends within 1 BLEU of one of its baselines, every system of that
claim also runs with seed 2 (a claim that already holds seed-2 rows runs its missing seed-2 runs
beside seed 1's). Last, a markdown table per claim is printed and a figure per claim
drawn (``claim_<name>.png`` in ``--figures``, default WORK: BLEU bars, validation-loss curves).
``--progress`` prints where every run stands, from its logs, and trains nothing.
"""
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Tuple

import torch

from ..checkpoint_loading import average_checkpoints
from ..plotting import pyplot
from . import runner
from .claims import CLAIMS, Claim, System
from .compare import bleu_summary
from .scoring import BIN, USER_DIR, corpus_bleu, generate
from .settings import OPTIMISATION, criterion_flags

#: The repository's examples: the study runs from a checkout (stage 3's targets come from a recipe's script).
EXAMPLES = USER_DIR.parent / "examples"

AVERAGED = 5
SEEDS = (1, 2)
#: Seed 2 runs for every system of a claim whose design ends this close (BLEU) to a baseline.
CLOSE_BLEU = 1.0


def training(system: System) -> tuple:
    """What decides a system's run (its name does not)."""
    return system.flags, tuple(sorted(system.evaluate.items())), system.widths


def device_name(args) -> str:
    """Where a run trains, kept in its row: ``cpu``, or ``cuda (<the GPU's name>)``."""
    return "cpu" if args.device == "cpu" else f"cuda ({torch.cuda.get_device_name()})"


def fairseq_train(args, data, flags: Sequence[str], save: Path, seed: int, *extra, epochs: int = 0) -> dict:
    """Train (or resume) a system in ``save`` (``.runner.fairseq_train``): to convergence, or
    for exactly ``epochs`` epochs when given."""
    stop = ["--max-epoch", epochs] if epochs else ["--max-epoch", args.max_epoch, "--patience", args.patience]
    return runner.fairseq_train(data, save, [*OPTIMISATION, *flags, *criterion_flags(flags), "--seed", seed, *extra],
                                stop=[*stop, "--keep-last-epochs", AVERAGED], cpu=args.device == "cpu")


def average_last_epochs(save: Path) -> Path:
    """Average the last (up to) 5 epoch checkpoints of ``save`` into ``checkpoint_avg.pt``."""
    epochs = sorted((int(m[1]), p) for p in save.glob("checkpoint*.pt") if (m := re.fullmatch(r"checkpoint(\d+)\.pt",
                                                                                              p.name)))
    out = save / "checkpoint_avg.pt"
    torch.save(average_checkpoints([p for _, p in epochs[-AVERAGED:]]), out)
    return out


def overrides(values: Dict[str, str]) -> List[str]:
    return ["--model-overrides", repr(values)] if values else []


def score(args, checkpoint: Path, system: System, width: int = 0) -> dict:
    """Validation loss (bits; label-smoothed and NLL) and test_2016 sacreBLEU of ``checkpoint``
    (``width``: of that sub-Transformer of a scalable model)."""
    task = system.flags[system.flags.index("--task") + 1] if "--task" in system.flags else "translation"
    # fairseq-validate builds the checkpoint's own task (overridable); fairseq-generate the command line's
    validate = overrides({**system.evaluate, **({"eval_width": str(width)} if width else {})})
    valid = subprocess.run([str(c) for c in [BIN / "fairseq-validate", args.data, "--user-dir",
                                             USER_DIR, "--task", task, "--path", checkpoint,
                                             "--valid-subset", "valid", "--max-tokens", "4096",
                                             *(["--cpu"] if args.device == "cpu" else []),
                                             *validate]], capture_output=True, text=True, check=True)
    losses = re.search(r"valid on 'valid' subset \| loss ([\d.]+) \| nll_loss ([\d.]+)", valid.stdout + valid.stderr)
    out = checkpoint.with_name(f"generate{'-w%d' % width if width else ''}.txt")
    generate(args.data, checkpoint, out, args.bpe_codes, args.beam, "1.0", "--max-len-b", args.max_len_b,
             "--task", task, *(["--eval-width", width] if width else []), *overrides(system.evaluate),
             cpu=args.device == "cpu")
    bleu, signature = corpus_bleu(out, args.ref)
    return {"valid_loss": float(losses[1]), "valid_nll_loss": float(losses[2]), "bleu": round(bleu.score, 2),
            "bleu_signature": str(signature), **({"evaluate": system.evaluate} if system.evaluate else {})}


def parameters(checkpoint: Path, width: int = 0) -> int:
    """Parameters of the model (``width``: of that sub-Transformer), the stats tool's count."""
    from fairseq import checkpoint_utils

    from fairseq_widearch.experiments.counting import param_counts, sub_transformer_param_counts
    [model], _ = checkpoint_utils.load_model_ensemble([str(checkpoint)])
    if width:
        model.set_sample_config(width)
        return sub_transformer_param_counts(model)["params"]
    return param_counts(model)["params"]


def latent_kept(checkpoint: Path) -> dict:
    """``{"latent_kept": {module: [layer indices]}}``: the layers hard selection keeps in each
    latent stack of the model (σ(α_l) above its LayerSelect's threshold); {} for other models."""
    from fairseq import checkpoint_utils

    from fairseq_widearch.modules import LayerSelect
    [model], _ = checkpoint_utils.load_model_ensemble([str(checkpoint)])
    kept = {name: (select.probs()[0] > select.threshold).nonzero().flatten().tolist()
            for name, select in model.named_modules() if isinstance(select, LayerSelect)}
    return {"latent_kept": kept} if kept else {}


def train_scalable(args, system: System, run: Path, seed: int) -> dict:
    """Stages 1-3 (Eqs. 6, 7, 9), each with a fresh Adam; stage 3 on the stage-2 model's beam
    outputs for the training set. Stage 1 trains to convergence, stages 2 and 3 for the share of
    its epochs that Table 4 gives them (60, 60, 30 epochs on En-De): not to the validation loss,
    which the annealed distillation of stage 2 raises for a few epochs and the distilled targets of
    stage 3 raise for good. -> the totals over the stages."""
    save1, save2, save3 = trainings(run, system)
    stage1 = fairseq_train(args, args.data, system.flags, save1, seed, "--distill-stage", "1")
    stage2 = fairseq_train(args, args.data, system.flags, save2, seed, "--distill-stage", "2",
                           "--lambda2-anneal-updates", "100", "--finetune-from-model", save1 / "checkpoint_last.pt",
                           epochs=stage1["epochs"])
    distilled, timing = run / "distilled", run / "distilled.json"
    if not timing.exists():
        start = time.perf_counter()
        subprocess.run([sys.executable, EXAMPLES / "scalable_transformer" / "distillation_targets.py",
                        "--data", args.data, "--checkpoint", save2 / "checkpoint_last.pt", "--out", distilled,
                        "--device", args.device, "--max-len", str(args.max_len_b)],
                       check=True, capture_output=True)
        timing.write_text(json.dumps({"seconds": round(time.perf_counter() - start, 1)}))
    stage3 = fairseq_train(args, distilled, system.flags, save3, seed, "--distill-stage", "3",
                           "--lambda3", "0.9", "--finetune-from-model", save2 / "checkpoint_last.pt",
                           epochs=max(1, stage1["epochs"] // 2))
    stages = (stage1, stage2, stage3)
    # fairseq's clock runs on in a training fine-tuned from a checkpoint (--finetune-from-model
    # restores its previous_training_time), so stage 3's clock already counts stages 1 and 2
    return {"epochs": "+".join(str(s["epochs"]) for s in stages), "updates": sum(s["updates"] for s in stages),
            "train_seconds": round(stage3["train_seconds"] + json.loads(timing.read_text())["seconds"], 1)}


def run_dir(work: Path, claim: Claim, system: System, seed: int) -> Path:
    return work / claim.name / re.sub(r"\W+", "_", system.name) / f"seed{seed}"


def trainings(run: Path, system: System) -> List[Path]:
    """The fairseq-train directories of a run, in training order (a scalable model's three stages)."""
    return [run / f"stage{i}" for i in (1, 2, 3)] if system.widths else [run]


VALID_LINE = re.compile(r"\| epoch (\d+) \| valid on 'valid' subset \| loss ([\d.]+)")


def validation_losses(save: Path) -> Dict[int, float]:
    """Epoch -> validation loss (bits; a scalable model's widest) from ``save/train.log``."""
    log = save / "train.log"
    return {int(m[1]): float(m[2]) for m in VALID_LINE.finditer(log.read_text())} if log.exists() else {}


def curve(run: Path, system: System) -> List[float]:
    """The run's validation loss after each epoch, a scalable model's stages one after another."""
    return [loss for save in trainings(run, system) for _, loss in sorted(validation_losses(save).items())]


def run_system(args, claim: Claim, system: System, seed: int) -> List[dict]:
    """Train one system to convergence, average and score it: one row (one per width if scalable)."""
    run = run_dir(args.work_dir, claim, system, seed)
    head = {"claim": claim.name, "seed": seed, "device": device_name(args)}
    if not system.widths:
        training = fairseq_train(args, args.data, system.flags, run, seed)
        checkpoint = average_last_epochs(run)
        return [{**head, "system": system.name, **training, "params": parameters(checkpoint),
                 **latent_kept(checkpoint), **score(args, checkpoint, system), "valid_curve": curve(run, system)}]
    training = train_scalable(args, system, run, seed)
    checkpoint = average_last_epochs(trainings(run, system)[-1])
    losses = curve(run, system)  # the widest's, shared by every width
    return [{**head, "system": f"{system.name} w{w}", **training, "params": parameters(checkpoint, w),
             **score(args, checkpoint, system, w), "valid_curve": losses} for w in system.widths]


def close_claims(rows: List[dict], claims: Sequence[Claim]) -> List[Claim]:
    """Claims whose design ends within ``CLOSE_BLEU`` of a baseline at seed 1."""
    bleu = {(r["claim"], r["system"]): r["bleu"] for r in rows if r["seed"] == SEEDS[0]}
    return [c for c in claims if any(abs(bleu[c.name, a] - bleu[c.name, b]) < CLOSE_BLEU for a, b in c.pairs)]


class Results(runner.Results):
    """The study's results file: one row per (claim, system, seed); ``claims``: the claims whose
    shared systems (``twin``) a run may take its rows from."""

    def __init__(self, path: Path, claims: Iterable[Claim] = CLAIMS.values()):
        super().__init__(path, key=("claim", "system", "seed"))
        self.claims = list(claims)

    def done(self, claim: Claim, system: System, seed: int) -> bool:
        """Whether every row of the run is in, scored as the system decodes now (``evaluate``): a
        row scored under another decoding does not count, and its rescoring replaces it."""
        names = [f"{system.name} w{w}" for w in system.widths] or [system.name]
        found = {(r["claim"], r["system"], r["seed"]) for r in self.rows if r.get("evaluate", {}) == system.evaluate}
        return all((claim.name, name, seed) in found for name in names)

    def rows_of(self, claim: Claim, system: System, seed: int) -> List[dict]:
        """The run's rows (one per width, the widest last, for a scalable model), [] before it is scored."""
        if not self.done(claim, system, seed):
            return []
        return [r for r in self.rows if r["claim"] == claim.name and r["seed"] == seed
                and system_and_width(r["system"], claim)[0] == system.name]

    def twin(self, claim: Claim, system: System, seed: int) -> List[dict]:
        """The rows of the same training (flags, seed) recorded under another claim, renamed for
        this one: a system two claims share (the stock 3 + 3 Transformer is multi-path's shallow
        baseline and WideNet's reference) trains once. [] when there is none yet."""
        for other in self.claims:
            for same in other.systems:
                if other is not claim and training(same) == training(system) and self.done(other, same, seed):
                    return [{**r, "claim": claim.name, "system": system.name + r["system"][len(same.name):],
                             "same_run_as": f"{other.name}: {r['system']}"} for r in self.rows_of(other, same, seed)]
        return []


def first_runs(results: Results, claims: Sequence[Claim]) -> List[Tuple[Claim, int]]:
    """(claim, seed) to run first: seed 1 of every claim, and seed 2 of each claim that already
    holds seed-2 rows (a rescored or interrupted run there is known to be wanted, so it runs beside
    seed 1's runs rather than after them)."""
    started = {r["claim"] for r in results.rows if r["seed"] == SEEDS[1]}
    return [(c, SEEDS[0]) for c in claims] + [(c, SEEDS[1]) for c in claims if c.name in started]


def run_all(args, results: Results, runs: Sequence[Tuple[Claim, int]]):
    """Every run of the (claim, seed) pairs ``runs`` not yet done, ``args.jobs`` at once, each
    recorded as it finishes (a run another claim has recorded is copied, not trained again)."""
    todo = [(c, s, seed) for c, seed in runs for s in c.systems if not results.done(c, s, seed)]

    def run(claim: Claim, system: System, seed: int):
        results.add(results.twin(claim, system, seed) or run_system(args, claim, system, seed))

    runner.run_jobs(run, todo, args.jobs)


def joined(runs: List[dict], key: str, form: str = "{}") -> str:
    return ", ".join(form.format(r[key]) for r in runs)


def mean(runs: List[dict], key: str) -> float:
    return sum(r[key] for r in runs) / len(runs)


def system_and_width(name: str, claim: Claim) -> Tuple[str, int]:
    """A row name -> (its system's name, width): a scalable model's rows are "<system> w<width>".
    Raises ValueError for a name that is neither a system of ``claim`` nor of that form."""
    if any(s.name == name for s in claim.systems):
        return name, 0
    system, _, width = name.rpartition(" w")
    if not (system and width.isdigit()):
        raise ValueError(f"{name!r} is not a system of the {claim.name} claim")
    return system, int(width)


def row_names(rows: List[dict], claim: Claim) -> List[str]:
    """The claim's row names in its systems' order (the design first, a scalable model's widths
    narrowest first), whatever order runs finished in."""
    order = [s.name for s in claim.systems]

    def position(name: str) -> Tuple[int, int]:
        system, width = system_and_width(name, claim)
        return order.index(system), width

    return sorted(dict.fromkeys(r["system"] for r in rows if r["claim"] == claim.name), key=position)


def curves(rows: List[dict], claim: Claim) -> Dict[str, Tuple[int, List[float]]]:
    """System -> (seed, validation loss after each epoch) of its lowest seed that recorded a curve
    (rows transcribed from a lost results file have none; a scalable model's widths share one)."""
    recorded = sorted((r for r in rows if r["claim"] == claim.name and r.get("valid_curve")), key=lambda r: r["seed"])
    found: Dict[str, Tuple[int, List[float]]] = {}
    for r in recorded:
        found.setdefault(system_and_width(r["system"], claim)[0], (r["seed"], r["valid_curve"]))
    return {s.name: found[s.name] for s in claim.systems if s.name in found}


def table(rows: List[dict], claim: Claim) -> str:
    """Markdown: one line per system, seeds averaged (each seed's BLEU listed)."""
    lines = ["| system | params | epochs | updates | train time (s) | valid loss | BLEU: mean ± sd (per seed) |",
             "|---|---|---|---|---|---|---|"]
    for name in row_names(rows, claim):
        runs = sorted((r for r in rows if r["claim"] == claim.name and r["system"] == name), key=lambda r: r["seed"])
        lines.append(f"| {name} | {runs[0]['params'] / 1e6:.2f}M | {joined(runs, 'epochs')} | "
                     f"{joined(runs, 'updates')} | "
                     f"{joined(runs, 'train_seconds', '{:.0f}')} | {mean(runs, 'valid_loss'):.3f} | "
                     f"{bleu_summary([r['bleu'] for r in runs])} |")
    return "\n".join(lines)


def progress(work: Path, results: Results, claims: Sequence[Claim]) -> str:
    """Markdown: where every run of ``claims`` stands (scored, here or as the system another claim
    shares; trained; the epoch reached; not started) and its validation loss: a scored run's, on
    its averaged checkpoint, from its row; the best so far of any other, read from its logs.
    Trains nothing."""
    lines = ["| claim | system | seed | state | best valid loss (epoch) |", "|---|---|---|---|---|"]
    for claim in claims:
        for seed in SEEDS:
            for system in claim.systems:
                run = run_dir(work, claim, system, seed)
                done, twin = results.done(claim, system, seed), results.twin(claim, system, seed)
                # a second seed only where one was started here or scored anywhere
                if seed != SEEDS[0] and not (run.exists() or done or twin):
                    continue
                states, best = [], ""
                for stage, save in enumerate(trainings(run, system), 1):
                    losses = validation_losses(save)
                    name = f"stage {stage} " if system.widths else ""
                    if not losses:
                        # started (its log is there) but still in its first epoch
                        states += [f"{name}in progress, epoch 1"] if (save / "train.log").exists() else []
                        break
                    trained = (save / "training.json").exists()
                    states.append(f"{name}{'trained' if trained else 'in progress'}, epochs 1-{max(losses)}")
                    epoch = min(losses, key=losses.get)
                    best = f"{name}{losses[epoch]:.3f} ({epoch})"
                state = ("scored" if done else f"scored as {twin[0]['same_run_as']}"
                         if twin else "; ".join(states) or "not started")
                # a scored run's own figure: the logs here may be another device's try of it
                scored = results.rows_of(claim, system, seed) or twin
                best = f"{scored[-1]['valid_loss']:.3f} (averaged)" if scored else best
                lines.append(f"| {claim.name} | {system.name} | {seed} | {state} | {best} |")
    return "\n".join(lines)


def plot(rows: List[dict], claim: Claim, path: Path):
    """Left, BLEU per system: a bar at the mean over seeds (its value printed), a dot per seed, the
    design's bars blue; the axis starts near the lowest score so that 1-BLEU gaps show. Right,
    validation loss after each epoch of each system's first recorded seed (a scalable model's
    widest, its three stages one after another), down to 1 bit above the lowest."""
    plt = pyplot()
    names = row_names(rows, claim)
    design = {a for a, _ in claim.pairs}
    fig, (ax, loss_ax) = plt.subplots(1, 2, figsize=(4.4 + 1.1 * len(names), 3.4))
    lowest = min((r["bleu"] for r in rows if r["claim"] == claim.name), default=0.0)
    for i, name in enumerate(names):
        bleu = [r["bleu"] for r in rows if r["claim"] == claim.name and r["system"] == name]
        average = sum(bleu) / len(bleu)
        ax.bar(i, average, color="tab:blue" if name in design else "tab:gray", alpha=0.8)
        ax.scatter([i] * len(bleu), bleu, color="black", s=12, zorder=3)
        ax.annotate(f"{average:.2f}", (i, average), ha="center", va="bottom", fontsize=7,
                    xytext=(0, 2), textcoords="offset points")
    ax.set_ylim(bottom=max(0.0, lowest - 3))
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("sacreBLEU, test_2016")
    ax.set_title(claim.name, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    recorded = curves(rows, claim)
    for name, (seed, losses) in recorded.items():
        loss_ax.plot(range(1, len(losses) + 1), losses, label=f"{name}, seed {seed}", lw=1.2)
    if recorded:
        loss_ax.set_ylim(top=min(min(losses) for _, losses in recorded.values()) + 1)
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("validation loss (bits)")
    loss_ax.legend(fontsize=7)
    loss_ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None, claims: Dict[str, Claim] = CLAIMS):
    """The study's command line (this module's docstring) over ``claims`` (by name)."""
    p = runner.data_arguments(__doc__)
    p.add_argument("--work-dir", type=Path, default=Path("runs") / "claims")
    p.add_argument("--claims", default=",".join(claims), help="comma-separated subset of " + ",".join(claims))
    p.add_argument("--jobs", type=int, default=1, help="runs at once")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--max-epoch", type=int, default=40)
    p.add_argument("--patience", type=int, default=3, help="epochs without a better validation loss before stopping")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--max-len-b", type=int, default=200,
                   help="longest output in tokens of every decoding (fairseq's default 200); the stage-3 targets "
                        "drop pairs with a longer side (distillation_targets.py --max-len)")
    p.add_argument("--results", type=Path, help="the results file, one row per run (default WORK/results.jsonl)")
    p.add_argument("--figures", type=Path, help="directory of the claim_<name>.png figures (default WORK)")
    p.add_argument("--progress", action="store_true",
                   help="print where every run stands (from its logs) and stop; trains nothing")
    args = p.parse_args(argv)
    unknown = set(args.claims.split(",")) - set(claims)
    if unknown:
        p.error(f"unknown claims {sorted(unknown)}; choose from {', '.join(claims)}")
    chosen = [claims[name] for name in args.claims.split(",")]
    runner.share_cores(args.device, args.jobs)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    results = Results(args.results or args.work_dir / "results.jsonl", claims.values())
    if args.progress:
        print(progress(args.work_dir, results, chosen))
        return
    run_all(args, results, first_runs(results, chosen))
    run_all(args, results, [(c, SEEDS[1]) for c in close_claims(results.rows, chosen)])
    for claim in chosen:
        print(f"\n## {claim.statement}\n\n{table(results.rows, claim)}")
        plot(results.rows, claim, (args.figures or args.work_dir) / f"claim_{claim.name}.png")


if __name__ == "__main__":
    main()
