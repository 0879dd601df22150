"""Compare the stock pre-norm Transformer and the five wide architectures on Multi30k En->De.

    python -m fairseq_widearch.experiments.compare --data BIN --bpe-codes CODES --ref REFERENCE
        [--max-update 1320] [--seeds 1,2] [--minutes M] [--work-dir runs/compare] [--systems a,b,...]
        [--device cpu|cuda] [--jobs 1] [--results FILE] [--figure PNG] [--train-flags "..."]

Every system trains the same number of updates (``--max-update``; the scalable model
``SCALABLE_STAGE1_SHARE`` of them in stage 1, the rest in stage 2) with the same flags, at every
seed of ``--seeds``; then ``checkpoint_last.pt`` decodes test_2016 with the same beam settings
through ``fairseq-generate``. Per run (per width for the scalable model) it records ``params``
and ``macs`` (one teacher-forced 20 + 20-token pair; ``fairseq_widearch.cli.stats``), the updates,
``train_wall_s`` (fairseq's wall clock: a CPU's speed can move 25-40 % from day to day (2 x86 cores, 2026-11), so it
is reported, never compared), ``decode_sentences_per_s`` (fairseq-generate's own timing) and
sacreBLEU with its signature. ``--minutes`` is an upper bound on a run's training time; a run it
cuts short is recorded with its updates and flagged in the table. ``--device cuda`` trains and
decodes on the GPU (fp32; each row records its device) and ``--jobs N`` runs N at once (on a CPU,
each given one N-th of the cores through ``OMP_NUM_THREADS`` unless that is set).

Training speed is measured apart, side by side in one process (``side_by_side_throughput``):
every system, built afresh from its training flags (the scalable model's stage 2), runs the same
number of real training batches through its task's ``train_step`` (forward and backward), in
alternating rounds, so that whatever else the machine does weighs on every system alike; it needs
no checkpoint, so the rows of runs made elsewhere (on a GPU, say) gain a CPU speed measured here. It gives
``train_tokens_per_s`` (target tokens per second), ``train_flops_per_token``
(``torch.utils.flop_counter``) and ``utilisation`` (FLOPs/token × tokens/s over the machine's fp32
matmul peak, measured in the same process).

Rows go to ``--results`` (default ``WORK/results.jsonl``; a run already there is skipped, so a
file kept apart from WORK carries the comparison across machines; an interrupted training resumes,
``.runner``), the throughput to ``WORK/throughput.json``; then a markdown table (BLEU as mean ±
sample standard deviation over the seeds, with every seed's score) and BLEU against MACs in
``--figure``.
"""
import json
import re
import shlex
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Dict

from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ..plotting import pyplot
from . import runner
from .counting import alternating_rounds, count_macs, matmul_peak_flops, param_counts, sub_transformer_param_counts
from .scoring import USER_DIR, corpus_bleu, generate
from .settings import BODY, OPTIMISATION, PRE_NORM, criterion_flags, plugin_archs

#: The comparison's flags beyond an architecture's ``_multi30k`` preset (the others: none).
SETTINGS = {
    "widenet": ["--moe-balance-weight", "0.01"],
    "scalable_transformer": ["--encoder-embed-dim", "192", "--encoder-ffn-embed-dim", "768", "--encoder-attention-heads",
                             "3", "--decoder-attention-heads", "3", "--scalable-widths", "64,128,192", "--width-dropout",
                             "", "--task", "scalable_translation", "--criterion", "scalable_self_distillation"],
}
#: name -> fairseq-train flags: the transformer, then every architecture the plugin registers, at its
#: ``_multi30k`` preset. The transformer is the shared Multi30k body with 4 + 4 layers, so its
#: parameter count (2.9M) sits with the wide models' (2.3-3.2M; the scalable model's 128-wide
#: sub-Transformer 3.0M, its widest 4.8M).
SYSTEMS = {
    "transformer": ["--arch", "transformer", *BODY, "--encoder-layers", "4", "--decoder-layers", "4", *PRE_NORM],
    **{arch: ["--arch", f"{arch}_multi30k", *SETTINGS.get(arch, [])] for arch in plugin_archs()},
}
SCALABLE_WIDTHS = (64, 128, 192)
#: Scalable Transformers train in stages (Gao et al. 2021, Sec. 3.3): stage 1 (Eq. 6) for this
#: share of the updates, then stage 2 (Eq. 7, lambda_2 annealed over 100 updates) from it with a
#: fresh Adam warming up from half the peak learning rate. Stage 3 is left out: decoding the
#: training set would cost more than the budget.
SCALABLE_STAGE1_SHARE = 0.6
SCALABLE_STAGE2 = ("--distill-stage", "2", "--lambda2-anneal-updates", "100", "--warmup-init-lr", "0.0015")


def training_updates(*logs: str) -> int:
    """Updates over one or more fairseq-train logs (each stage counts from 0)."""
    return sum(int(re.findall(r"\| num_updates (\d+)", log)[-1]) for log in logs)


def training_wall_seconds(*logs: str) -> float:
    """fairseq's wall clock at the end of training in seconds, summed over the logs (one per stage).

    A training resumed from its checkpoint appends to the same log, and fairseq starts its wall
    clock again from 0: each run's last epoch summary is counted, a drop in the clock ending a run."""
    total = 0.0
    for log in logs:
        walls = [float(w) for w in re.findall(r"\| num_updates \d+ \|.*\| wall (\d+)", log)]
        total += sum(w for w, following in zip(walls, [*walls[1:], 0.0]) if following < w)
    return total


def cut_short(*logs: str) -> bool:
    """Whether ``--stop-time-hours`` (``--minutes``) ended any of the trainings."""
    return any("Stopping training due to cumulative_training_time" in log for log in logs)


class _Backward:
    """The one optimizer method a task's ``train_step`` calls."""

    @staticmethod
    def backward(loss):
        loss.backward()


def training_setup(flags, data: str, batches: int):
    """(model, criterion, task, the first ``batches`` training batches) of a system built afresh from
    its training ``flags``, as fairseq-train builds it: a model's speed does not depend on its
    weights, so training speed is measured on any machine, without the runs' checkpoints."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    argv = [data, "--user-dir", str(USER_DIR), *OPTIMISATION, *flags, *criterion_flags(flags)]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    task = tasks.setup_task(cfg.task)
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    task.load_dataset("train")
    iterator = task.get_batch_iterator(task.dataset("train"), max_tokens=cfg.dataset.max_tokens, seed=1,
                                       max_positions=model.max_positions()).next_epoch_itr(shuffle=True)
    return model.train(), criterion, task, [sample for _, sample in zip(range(batches), iterator)]


def train_steps(setup, update_num: int = 1000) -> int:
    """Forward and backward of every batch of ``setup`` through its task's ``train_step``; returns
    the target tokens."""
    model, criterion, task, samples = setup
    for sample in samples:
        model.zero_grad()
        task.train_step(sample, model, criterion, _Backward(), update_num)
    return sum(sample["ntokens"] for sample in samples)


def training_flops_per_token(setup) -> float:
    """FLOPs of the training steps of ``setup`` (forward + backward through the task's
    ``train_step``, the system's own criterion) per target token, counted by
    ``torch.utils.flop_counter`` (attention through the math SDPA kernel so its matmuls are seen)."""
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        tokens = train_steps(setup)
    return counter.get_total_flops() / tokens


def side_by_side_throughput(systems: Dict[str, list], data: str, peak: float, batches: int = 4,
                            rounds: int = 3) -> Dict[str, dict]:
    """``{system: {train_tokens_per_s, train_flops_per_token, utilisation}}`` for ``systems``
    (name -> training flags, built afresh: ``training_setup``): the first ``batches`` training
    batches, forward and backward, timed in ``rounds`` alternating rounds in this process (the
    order rotates every round; one untimed warm-up round first). Tokens/s = Σ target tokens / Σ
    seconds over the timed rounds; utilisation = FLOPs/token × tokens/s / ``peak`` (FLOP/s)."""
    setups = {name: training_setup(flags, data, batches) for name, flags in systems.items()}
    tokens = {name: train_steps(setup) for name, setup in setups.items()}  # the warm-up round
    seconds = alternating_rounds({name: partial(train_steps, setup) for name, setup in setups.items()}, rounds)
    speeds = {}
    for name, setup in setups.items():
        per_s, flops = rounds * tokens[name] / seconds[name], training_flops_per_token(setup)
        speeds[name] = {"train_tokens_per_s": round(per_s, 1), "train_flops_per_token": round(flops),
                        "utilisation": round(flops * per_s / peak, 4)}
    return speeds


def model_size(checkpoint: Path, data: str, width: int = 0) -> dict:
    """``params`` and ``macs`` (20 + 20 tokens) of a trained model, or of its sub-Transformer of ``width``."""
    from fairseq import checkpoint_utils
    [model], _ = checkpoint_utils.load_model_ensemble([str(checkpoint)], arg_overrides={"data": data})
    if width:
        model.set_sample_config(width)
    params = sub_transformer_param_counts(model) if width else param_counts(model)
    return {"params": params["params"], "macs": count_macs(model), **latent_posterior(model)}


def latent_posterior(model) -> dict:
    """A latent-depth model's final q(z_l = 1) per layer of each latent stack (``latent_q_<stack>``,
    one list per language pair, rounded to 4 places) and its expected depth Σ_l q_l
    (``latent_expected_depth_<stack>``, of the first pair); {} for any other model."""
    posterior = {}
    for stack in ("encoder", "decoder"):
        select = getattr(getattr(model, stack), "layer_select", None)
        if select is not None:
            q = select.probs().detach()
            posterior[f"latent_q_{stack}"] = [[round(v, 4) for v in row] for row in q.tolist()]
            posterior[f"latent_expected_depth_{stack}"] = round(q[0].sum().item(), 3)
    return posterior


def decode(args, checkpoint: Path, out: Path, width: int = 0) -> dict:
    """Decode test_2016 with fairseq-generate; sentences/s (its own timing) and sacreBLEU."""
    task = ["--task", "scalable_translation", "--eval-width", width] if width else []
    log = generate(args.data, checkpoint, out, args.bpe_codes, args.beam, args.lenpen, *task, cpu=args.device == "cpu")
    speed = re.search(r"Translated .* \(([\d.]+) sentences/s", log)
    score, signature = corpus_bleu(out, args.ref)
    return {"decode_sentences_per_s": float(speed.group(1)), "bleu": round(score.score, 2),
            "bleu_signature": str(signature)}


def train(args, flags, save: Path, seed: int, updates: int, *extra) -> str:
    """Train to ``updates`` updates (``--minutes``: an upper bound) in ``save``, the system's
    criterion unless ``flags`` name one (``.runner.fairseq_train``: resumed if interrupted, not
    started again once finished); returns its log."""
    limit = ["--stop-time-hours", f"{args.minutes / 60:.6f}"] if args.minutes else []
    runner.fairseq_train(args.data, save, [*OPTIMISATION, "--seed", seed, *flags, *criterion_flags(flags), *extra,
                                           *args.train_flags, "--no-epoch-checkpoints"],
                         stop=["--max-update", updates, "--max-epoch", 1000, *limit], cpu=args.device == "cpu",
                         log_interval=50)
    return (save / "train.log").read_text()


def run_dir(args, name: str, seed: int) -> Path:
    """Where a run trains: per budget, since a finished training is not resumed (``.runner``) and
    a run to another ``--max-update`` is another run."""
    return args.work_dir / f"{args.max_update}_updates" / f"seed{seed}" / name


def train_system(args, name: str, seed: int) -> list:
    """Train one system for ``--max-update`` updates (the scalable model in two stages); returns its logs."""
    save = run_dir(args, name, seed)
    if name != "scalable_transformer":
        return [train(args, SYSTEMS[name], save, seed, args.max_update)]
    stage1, first = save / "stage1", round(args.max_update * SCALABLE_STAGE1_SHARE)
    log = train(args, SYSTEMS[name], stage1, seed, first, "--distill-stage", "1")
    return [log, train(args, SYSTEMS[name], save, seed, args.max_update - first, *SCALABLE_STAGE2,
                       "--finetune-from-model", stage1 / "checkpoint_last.pt")]


def training_flags(name: str) -> list:
    """The flags a system's (last) training runs with: the scalable model's stage 2."""
    return [*SYSTEMS[name], *SCALABLE_STAGE2] if name == "scalable_transformer" else SYSTEMS[name]


def run_system(args, name: str, seed: int) -> list:
    """Train and decode one system at one seed: one result row, or one per width of the scalable model."""
    logs = train_system(args, name, seed)
    checkpoint = run_dir(args, name, seed) / "checkpoint_last.pt"
    training = {"seed": seed, "device": args.device, "max_update": args.max_update,
                **({"train_flags": " ".join(args.train_flags)} if args.train_flags else {}),
                "updates": training_updates(*logs), "train_wall_s": training_wall_seconds(*logs),
                "cut_short": cut_short(*logs)}
    widths = SCALABLE_WIDTHS if name == "scalable_transformer" else (0,)
    rows = []
    for width in widths:
        label = f"{name} w{width}" if width else name
        out = checkpoint.with_name(f"generate{'-w%d' % width if width else ''}.txt")
        rows.append({"system": label, "width": width, **model_size(checkpoint, args.data, width), **training,
                     **decode(args, checkpoint, out, width)})
    return rows


def bleu_summary(scores) -> str:
    """'mean ± sd (s1, s2, ...)'; the sd is left out for one seed."""
    each = ", ".join(f"{b:.2f}" for b in scores)
    if len(scores) == 1:
        return f"{scores[0]:.2f} (one seed)"
    return f"{statistics.mean(scores):.2f} ± {statistics.stdev(scores):.2f} ({each})"


def summarise(rows, speeds: Dict[str, dict]) -> list:
    """One entry per system (per width), in ``SYSTEMS``' order: its rows over the seeds, BLEU
    statistics, each run's decoding speed and wall time, the throughput."""
    systems = sorted(dict.fromkeys(r["system"] for r in rows), key=lambda s: list(SYSTEMS).index(s.split(" ")[0]))
    out = []
    for system in systems:
        runs = sorted((r for r in rows if r["system"] == system), key=lambda r: r["seed"])
        bleu = [r["bleu"] for r in runs]
        out.append({**runs[0], "bleu": statistics.mean(bleu), "bleu_sd": statistics.stdev(bleu) if len(bleu) > 1 else 0.0,
                    "bleu_seeds": bleu, "seeds": [r["seed"] for r in runs],
                    "train_wall_s": [r["train_wall_s"] for r in runs],
                    "decode_sentences_per_s": [r["decode_sentences_per_s"] for r in runs],
                    "cut_short": any(r["cut_short"] for r in runs),
                    **speeds.get(system.split(" ")[0], {})})
    return out


def table(summary) -> str:
    head = ("| system | params | MACs (20+20) | updates | BLEU: mean ± sd (per seed) | train tokens/s, side by side | "
            "utilisation | decode sent/s per run | training wall time per run |\n|---|---|---|---|---|---|---|---|---|")
    lines = []
    for r in summary:
        speed = (f"{r['train_tokens_per_s']:,.0f} | {100 * r['utilisation']:.1f}%" if "utilisation" in r
                 else "not measured | not measured")
        cut = " (cut short by --minutes)" if r["cut_short"] else ""
        lines.append(f"| {r['system']} | {r['params'] / 1e6:.2f}M | {r['macs'] / 1e6:.1f}M | {r['updates']}{cut} | "
                     f"{bleu_summary(r['bleu_seeds'])} | {speed} | "
                     + ", ".join(f"{d:.1f}" for d in r["decode_sentences_per_s"]) + " | "
                     + ", ".join(f"{w:.0f} s" for w in r["train_wall_s"]) + " |")
    return "\n".join([head, *lines])


def plot(summary, path: Path):
    """BLEU (mean over the seeds, bars: ± sd) against MACs: one point per system, the scalable
    model's widths joined as a curve."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    scalable = sorted((r for r in summary if r["width"]), key=lambda r: r["macs"])
    points = [r for r in summary if not r["width"]]
    for r in points:
        ax.errorbar(r["macs"] / 1e6, r["bleu"], yerr=r["bleu_sd"], fmt="o", ms=6, capsize=3)
        # the label goes below its point where a near neighbour sits just above it, so labels do not meet
        crowded = any(0 <= o["bleu"] - r["bleu"] <= 0.6 and abs(o["macs"] - r["macs"]) <= 1e7
                      for o in points if o is not r)
        ax.annotate(r["system"], (r["macs"] / 1e6, r["bleu"]), textcoords="offset points", fontsize=8,
                    xytext=(6, -11 if crowded else 4))
    if scalable:
        ax.errorbar([r["macs"] / 1e6 for r in scalable], [r["bleu"] for r in scalable],
                    yerr=[r["bleu_sd"] for r in scalable], fmt="k--o", ms=4, capsize=3,
                    label="scalable_transformer, widths " + "/".join(str(r["width"]) for r in scalable))
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("MACs per 20+20-token sentence pair (millions)")
    ax.set_ylabel("sacreBLEU, Multi30k test_2016 En→De")
    seeds = ",".join(map(str, summary[0]["seeds"]))
    ax.set_title(f"{summary[0]['max_update']} updates each, seeds {seeds}, same beam")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = runner.data_arguments(__doc__)
    p.add_argument("--max-update", type=int, default=1320, help="training updates of every run (10 epochs)")
    p.add_argument("--seeds", default="1,2", type=lambda v: [int(x) for x in v.split(",")])
    p.add_argument("--minutes", type=float, default=0, help="upper bound on a run's training time; 0 = none")
    p.add_argument("--work-dir", type=Path, default=Path("runs") / "compare")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ",".join(SYSTEMS))
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the runs train and decode")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (on a GPU many small runs share the device)")
    p.add_argument("--train-flags", type=shlex.split, default=[],
                   help="more fairseq-train flags for every system, last (a variant: keep its --results apart); "
                        "recorded in each row")
    p.add_argument("--beam", default="5")
    p.add_argument("--lenpen", default="1.0")
    p.add_argument("--results", type=Path, help="the results file, one row per run (default WORK/results.jsonl)")
    p.add_argument("--figure", type=Path, help="PNG path (default WORK/bleu_vs_macs.png)")
    p.add_argument("--throughput", type=Path,
                   help="the speeds measured side by side (default WORK/throughput.json); measured and written "
                        "there when a system lacks one")
    args = p.parse_args(argv)
    systems = args.systems.split(",")
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    runner.share_cores(args.device, args.jobs)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    results = runner.Results(args.results or args.work_dir / "results.jsonl", key=("system", "seed"))
    speed_file = args.throughput or args.work_dir / "throughput.json"
    todo = [(name, seed) for seed in args.seeds for name in systems
            if not any(r["system"].split(" ")[0] == name and r["seed"] == seed for r in results.rows)]

    def run(name: str, seed: int):
        print(f"| {name}, seed {seed}: training {args.max_update} updates", flush=True)
        results.add(run_system(args, name, seed))

    runner.run_jobs(run, todo, args.jobs)
    rows = results.rows
    speeds = json.loads(speed_file.read_text()) if speed_file.exists() else {}
    if set(systems) - set(speeds):
        peak = matmul_peak_flops()  # fp32, this CPU, in this process
        print(f"| fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s; training speed side by side", flush=True)
        measured = side_by_side_throughput({name: [*training_flags(name), *args.train_flags] for name in systems},
                                           args.data, peak)
        # the systems measured now replace theirs; the file's others stay, each with its own peak and date
        speeds = {**speeds, **{name: {**speed, "matmul_peak_gflops": round(peak / 1e9, 1),
                                      "measured": time.strftime("%Y-%m-%d")} for name, speed in measured.items()}}
        speed_file.write_text(json.dumps(speeds, indent=1))
    summary = summarise([r for r in rows if r["system"].split(" ")[0] in systems], speeds)
    print(table(summary))
    print(f"BLEU signature: {rows[0]['bleu_signature']}")
    figure = args.figure or args.work_dir / "bleu_vs_macs.png"
    plot(summary, figure)
    print(f"| figure: {figure}")


if __name__ == "__main__":
    main()
