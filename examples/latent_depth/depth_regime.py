#!/usr/bin/env python
"""Latent depth in its own regime (Li et al. 2020, Table 3 and Figs. 2-3): post-norm decoders deep
enough that a static one may fail to train, on Multi30k one-to-many (en->de, fr, cs), with the
settings of fairseq's ``examples/latent_depth`` README as far as they carry over to 2 CPU cores
(docs/claims.md, "Latent depth in its own regime").

    python examples/latent_depth/depth_regime.py run [--systems static_24,static_12,lld_24] [--seeds 1,2]
        [--setting released] [--max-update 2000] [--jobs 2] [--device cpu] [--work-dir runs/depth]
        [--results docs/data/latent_depth_regime.jsonl] [--decode/--no-decode]
    python examples/latent_depth/depth_regime.py gradients [--systems static_24,lld_24] [--seeds 1]
        [--updates 0,250,1000,2000] [--gradients-results docs/data/latent_depth_gradients.jsonl]
    python examples/latent_depth/depth_regime.py figure [--gradients-results ...] [--out docs/img/latent_depth_gradients.png]
    python examples/latent_depth/depth_regime.py table --setting dropout_01_lr_div2 --systems static_6,static_12,lld_12
    python examples/latent_depth/depth_regime.py sources --setting dropout_01_lr_div2 --systems static_12,lld_12
    python examples/latent_depth/depth_regime.py curves [--results ...] [--systems static_100,lld_100]
        [--frequency-level 8.96] [--out docs/img/latent_depth_curves.png]

Systems: ``static_D`` is fairseq's post-norm ``transformer_iwslt_de_en`` with a D-layer decoder;
``lld_D`` our ``latent_depth_transformer_o2m_12_24`` (post-norm, the released layer) with D latent
decoder layers, target depth K = D / 2, under the released code's objective (``--latent-objective
released``). Both: the scaled body (d 128, FFN 512, 4 heads, 12 encoder layers, decoder input and
output embeddings tied), Adam (0.9, 0.98), eps 1e-6, lr 0.0015, inverse-sqrt from 1e-7, clip-norm
1.0, dropout and attention dropout 0.3, label smoothing 0.1, 2,048 tokens per update. What is
scaled: the width (512 -> 128, FFN 1024 -> 512) and the batch (the README's 4,096 tokens per pair
and update -> 2,048 in all) for the CPU, and every update window of the released run by 1/8 for a
2,000-update budget (warm-up 8,000 -> 1,000, the KL ramp 5,000 -> 625, soft samples 500 -> 63).
``--setting`` changes one thing at a time (:data:`SETTINGS`), to find the smallest setting in which
the static model diverges, or a gentler one where none trains at the released setting.

**Diverged** (fixed before the runs): training stops on a non-finite loss or gradient, or the mean
training loss over the last tenth of the updates is not below the training loss logged at a tenth
of the updates. Every run gets one JSON row (``--results``): its loss curve, the verdict and, if it
trained, sacreBLEU per pair of its last checkpoint (beam 5, length penalty 1, outputs at most
1.5 x source + 10 tokens, :data:`MAX_LEN`; the paper scores the last checkpoint), the latent model
decoded ``soft``. A latent row adds its translation term's curve (``ce_loss_curve``)
and the rule's verdict on it (``divergence_ce``): its loss adds the KL and depth terms, whose
weights ramp up over the KL ramp, so that the total rises by design. Runs resume from their
``checkpoint_last.pt`` and their decoding at its first unfinished output; a row written with
``--no-decode`` is decoded, and replaced, by a later ``run``; a row of fewer updates than
``--max-update`` is run on to it and replaced (:func:`done`). Interval checkpoints every 250
updates feed ``gradients``.

``sources``: each run's validation nll with its own sources and with each batch's sources rolled
by one (:func:`source_use`), one JSON line per run on stdout.

``gradients``: Fig. 2's measurement, the gradient norm of each decoder layer's parameters (mean over
8 fixed validation batches, training mode with dropout, the run's own loss at that update) at
initialisation (the model fairseq builds from the run's seed) and at interval checkpoints; rows in
``--gradients-results``.
"""
import argparse
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import torch

from fairseq_widearch.experiments.compare import training_updates
from fairseq_widearch.experiments.scoring import BIN, USER_DIR, corpus_bleu, generate
from head_to_head import PAIRS, gap, mean_spread, posterior  # this directory's head-to-head: the same pairs

ROOT = Path(__file__).resolve().parents[2]
TASK = ["--task", "translation_multi_simple_epoch", "--lang-pairs", "en-de,en-fr,en-cs", "--encoder-langtok", "tgt",
        "--decoder-langtok"]
BODY = ["--encoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512", "--decoder-embed-dim", "128",
        "--decoder-ffn-embed-dim", "512", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
        "--share-decoder-input-output-embed"]
#: the released README's run as scaled here: its optimisation (update windows x 1/8, module
#: docstring), dropout and encoder depth
RELEASED = {"lr": "0.0015", "warmup_updates": "1000", "kl_anneal_updates": "625", "soft_updates": "63",
            "dropout": "0.3", "encoder_layers": "12"}
#: one change at a time from the released setting (docs/claims.md says why each)
SETTINGS = {
    "released": {},
    # harsher, to find where a static decoder diverges
    "lr_x2": {"lr": "0.003"},
    "warmup_div8": {"warmup_updates": "125"},
    # gentler, since every decoder failed at the released one: the README's lr scaled by the square
    # root of the batch ratio (2,048 / 32,768 tokens per update); the head-to-head's dropout, for a
    # body 4x narrower than the README's; a 6-layer post-norm encoder
    "lr_div4": {"lr": "0.000375"},
    "dropout_01": {"dropout": "0.1"},
    "encoder_6": {"encoder_layers": "6"},
}
#: one change from dropout_01 (half its lr), where static 12/12 learnt below the token-frequency
#: level and then diverged at the peak lr
SETTINGS["dropout_01_lr_div2"] = {**SETTINGS["dropout_01"], "lr": "0.00075"}
INTERVAL = 250
#: fairseq-generate's length limit, 1.5 x source + 10 BPE tokens (32 on average) instead of its 200:
#: every reference of the three test sets ends at least 5 tokens below it, and a model that failed to
#: train loops to the limit (at 200, 20 minutes a pair on one core for the static 24-layer model)
MAX_LEN = ["--max-len-a", "1.5", "--max-len-b", "10"]
EPOCH_SUMMARY = re.compile(r"\| num_updates \d+")
#: a train_inner line's value of a logged field (``loss``: the total; ``ce_loss``: a latent model's
#: translation term, comparable with a static model's loss) and its update
FIELD = r"train_inner \| epoch \d+: +\d+ / \d+ .*?(?<![\w]){}=([^,]+),.*?num_updates=(\d+)"


def system_flags(system: str, schedule: dict) -> list:
    """fairseq-train's model and criterion flags of ``static_D`` or ``lld_D``."""
    kind, depth = system.split("_")
    body = [*BODY, "--encoder-layers", schedule["encoder_layers"], "--dropout", schedule["dropout"],
            "--attention-dropout", schedule["dropout"]]
    if kind == "static":
        return ["--arch", "transformer_iwslt_de_en", *body, "--decoder-layers", depth,
                "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
    return ["--arch", "latent_depth_transformer_o2m_12_24", *body, "--decoder-layers", depth,
            "--criterion", "latent_depth_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--latent-objective", "released", "--latent-prior", "aggregated", "--latent-kl-weight", "0.1",
            "--latent-kl-anneal-updates", schedule["kl_anneal_updates"],
            "--latent-soft-updates", schedule["soft_updates"], "--latent-target-layers", str(int(depth) // 2),
            "--latent-depth-weight", "0.1"]


def train_command(args, system: str, seed: int, save: Path) -> list:
    schedule = {**RELEASED, **SETTINGS[args.setting]}
    return [BIN / "fairseq-train", args.data / "bin", "--user-dir", USER_DIR, *TASK,
            *system_flags(system, schedule), *(["--cpu"] if args.device == "cpu" else []), "--num-workers", "0",
            "--seed", seed,
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-06", "--lr", schedule["lr"],
            "--lr-scheduler", "inverse_sqrt", "--warmup-init-lr", "1e-07", "--warmup-updates",
            schedule["warmup_updates"], "--clip-norm", "1.0", "--max-tokens", "2048",
            "--max-update", args.max_update, "--max-epoch", "1000", "--disable-validation",
            "--save-interval-updates", INTERVAL, "--keep-interval-updates", "-1", "--no-epoch-checkpoints",
            "--log-format", "simple", "--log-interval", "25", "--save-dir", save]


def run_name(system: str, setting: str, seed: int) -> str:
    return f"{system}-{setting}-seed{seed}"


def loss_curve(log: str, field: str = "loss") -> list:
    """[(update, training loss)] of every ``train_inner`` line (nan/inf kept as strings); where a
    resumed run logs an update again (it restarts from its last interval checkpoint), its own entry.
    ``field``: the logged term (:data:`FIELD`)."""
    pattern = re.compile(FIELD.format(field))
    curve = {int(u): float(v) if re.fullmatch(r"[\d.]+", v) else v for v, u in pattern.findall(log)}
    return sorted(curve.items())


def train_seconds(log: str) -> int:
    """Seconds of training over the fairseq-train invocations of ``log`` that finished ("done
    training in"; one killed before it and resumed is not counted). fairseq's own ``wall`` meter
    restarts at 0 in a resumed run and its epoch summaries say 0 there."""
    return round(sum(float(s) for s in re.findall(r"done training in ([\d.]+) seconds", log)))


def divergence(curve: list, failed: bool, max_update: int) -> str:
    """The reason a run diverged (module docstring), or '' if it trained."""
    if failed or any(isinstance(loss, str) for _, loss in curve):
        return "non-finite loss or gradient"
    tenth = [loss for update, loss in curve if update <= max_update // 10]
    last = [loss for update, loss in curve if update > max_update - max_update // 10]
    if not tenth or not last:
        return "too few logged updates to judge"
    return "" if statistics.mean(last) < tenth[-1] else "no progress after the first tenth"


def decoded(out: Path, checkpoint: Path) -> bool:
    """Whether ``out`` is a whole fairseq-generate output (its closing BLEU line) of ``checkpoint`` as
    it is now (written after it): a decode of a failed model takes up to 30 minutes on one core, so
    a run stopped while decoding resumes at its first unfinished pair."""
    if not out.exists() or out.stat().st_mtime < checkpoint.stat().st_mtime:
        return False
    lines = out.read_text(encoding="utf-8", errors="replace").splitlines()
    return bool(lines) and lines[-1].startswith("Generate test with beam=")


def decode(args, system: str, checkpoint: Path, out_dir: Path) -> dict:
    """sacreBLEU per decoding mode and pair of ``checkpoint`` on test_2016. A latent model decodes
    ``soft`` only, the plugin's default and the claims study's (docs/latent_depth_transformer.md,
    "Decoding"): with posteriors near 0.5, as these runs end, hard selection keeps an arbitrary subset
    that training drew no more often than any other, and it would double a decode that takes up to
    20 minutes per pair on one core."""
    modes = ["soft"] if system.startswith("lld") else ["static"]
    scores = {}
    for mode in modes:
        overrides = [] if mode == "static" else ["--model-overrides", repr({"latent_inference": mode})]
        for tgt in PAIRS:
            out = out_dir / f"generate-{mode}-en-{tgt}.txt"
            if not decoded(out, checkpoint):
                generate(args.data / "bin", checkpoint, out, args.data / "bpe" / "codes", 5, 1.0, *TASK, *MAX_LEN,
                         *overrides, target_lang=tgt, cpu=args.device == "cpu")
            score, _ = corpus_bleu(out, args.data / f"test.ref.{tgt}")
            scores.setdefault(mode, {})[tgt] = round(score.score, 2)
    return scores


def run_one(args, system: str, seed: int) -> dict:
    name = run_name(system, args.setting, seed)
    print(f"| {time.strftime('%H:%M')} starting {name}", flush=True)
    save = args.work_dir / "checkpoints" / name
    save.mkdir(parents=True, exist_ok=True)
    log_path = args.work_dir / f"train-{name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(log_path, "a") as log:
        proc = subprocess.run([str(c) for c in train_command(args, system, seed, save)], stdout=log,
                              stderr=subprocess.STDOUT, env=env)
    log = log_path.read_text()
    curve = loss_curve(log)
    reason = divergence(curve, proc.returncode != 0, args.max_update)
    row = {"system": system, "setting": args.setting, "seed": seed, "max_update": args.max_update,
           # fairseq's end-of-epoch summary, absent when training stopped on an error
           "updates": training_updates(log) if EPOCH_SUMMARY.search(log) else (curve[-1][0] if curve else 0),
           "train_wall_s": train_seconds(log),
           "diverged": bool(reason), "divergence": reason or None, "loss_curve": curve,
           "date": datetime.date.today().isoformat(), "device": args.device, "cpu_threads": 1}
    if system.startswith("lld"):  # its loss adds the KL and depth terms, whose weights ramp up
        ce = loss_curve(log, "ce_loss")
        row.update(ce_loss_curve=ce, divergence_ce=divergence(ce, proc.returncode != 0, args.max_update) or None)
    if proc.returncode == 0:
        last = save / "checkpoint_last.pt"
        row["q_decoder"] = posterior(last) if system.startswith("lld") else []
        if args.decode:  # a diverged run too: its BLEU says how little it learnt
            row["bleu"] = decode(args, system, last, save)
    return row


def read_rows(results: Path) -> list:
    """The JSON rows of ``results`` (none if it does not exist)."""
    return [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []


def key(row: dict) -> tuple:
    """A row's run: (system, setting, seed)."""
    return row["system"], row["setting"], row["seed"]


def done(results: Path, decode: bool, max_update: int) -> set:
    """The runs whose row is final: every row of ``max_update`` updates, but with ``decode`` not a
    finished run's row that was written without BLEU (``--no-decode``, e.g. when time ran out),
    which is decoded again. A row of fewer updates is not final either: its run resumes from its last
    checkpoint (where the work directory has it) to ``max_update``, as fairseq-train does with a larger
    ``--max-update``, and its new row replaces it.

    Raises:
        SystemExit: if a row has more updates than ``max_update`` (its run cannot be shortened, and
            a row of the shorter budget written over it would misstate its curve)."""
    rows = read_rows(results)
    longer = [f"{'-'.join(map(str, key(r)))} ({r['max_update']})" for r in rows if r["max_update"] > max_update]
    if longer:
        raise SystemExit(f"{results} has runs of more than --max-update {max_update}: {', '.join(longer)}; "
                         "ask for their updates or write to another --results")
    return {key(r) for r in rows
            if r["max_update"] == max_update and not (decode and "q_decoder" in r and "bleu" not in r)}


def write_row(results: Path, row: dict):
    """Append ``row``, replacing an earlier row of its run (one written without BLEU)."""
    kept = [r for r in read_rows(results) if key(r) != key(row)]
    results.write_text("".join(json.dumps(r) + "\n" for r in [*kept, row]))


def prepare(args):
    if not (args.data / "bin" / "dict.en.txt").exists():
        subprocess.run([sys.executable, str(ROOT / "examples" / "multi30k" / "prepare.py"), "--work-dir",
                        str(args.data), "--tgt", ",".join(PAIRS)], check=True)


def run(args):
    """Every run of ``--systems`` x ``--seeds`` without a final row yet (:func:`done`), ``--jobs`` at a
    time: the next one starts as soon as any finishes (the runs of a pair take unequal times), its
    row written then."""
    finished = done(args.results, args.decode, args.max_update)
    todo = [(s, seed) for seed in args.seeds for s in args.systems if (s, args.setting, seed) not in finished]
    prepare(args)
    with ThreadPoolExecutor(args.jobs) as pool:
        for future in as_completed([pool.submit(run_one, args, s, seed) for s, seed in todo]):
            row = future.result()
            write_row(args.results, row)
            print(f"| {time.strftime('%H:%M')} {row['system']} seed {row['seed']}: "
                  f"{row['divergence'] or 'trained'}, BLEU {row.get('bleu')}", flush=True)


def build(args, system: str, seed: int):
    """(task, model, criterion) as fairseq-train builds them for the run (the same seed, so at
    update 0 the same initial weights)."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    argv = [str(c) for c in train_command(args, system, seed, args.work_dir / "unused")[1:]]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    utils.set_torch_seed(seed)
    return task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)


def at_update(args, system: str, seed: int, update: int):
    """(task, model, criterion, the validation batches, 2,048 tokens each, in a fixed order) of the run
    at ``update``: its interval checkpoint, ``-1`` its last, 0 the initial weights; the model is told
    the checkpoint's update (a latent model's soft weights depend on it).

    Raises:
        FileNotFoundError: if ``update`` is -1 and the run has no ``checkpoint_last.pt``.
        StopIteration: if the run has no interval checkpoint of ``update``."""
    task, model, criterion = build(args, system, seed)
    if update:
        save = args.work_dir / "checkpoints" / run_name(system, args.setting, seed)
        checkpoint = save / "checkpoint_last.pt" if update < 0 else next(save.glob(f"checkpoint_*_{update}.pt"))
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        update = update if update > 0 else state["optimizer_history"][-1]["num_updates"]
    model.set_num_updates(update)
    task.load_dataset("valid")
    itr = task.get_batch_iterator(task.dataset("valid"), max_tokens=2048, seed=1).next_epoch_itr(shuffle=False)
    return task, model, criterion, itr


def layer_gradient_norms(args, system: str, seed: int, update: int, batches: int = 8) -> list:
    """Each decoder layer's gradient norm (per target token, as the optimiser sees it), averaged over
    the first ``batches`` validation batches, in training mode (dropout, z sampled as at ``update``)."""
    task, model, criterion, itr = at_update(args, system, seed, update)
    model.train()
    norms = torch.zeros(len(model.decoder.layers))
    for i, sample in zip(range(batches), itr):
        model.zero_grad()
        torch.manual_seed(i)
        loss, sample_size, _ = criterion(model, sample)
        (loss / sample_size).backward()
        norms += torch.stack([torch.nn.utils.get_total_norm([p.grad for p in layer.parameters() if p.grad is not None])
                              for layer in model.decoder.layers])
    # 4 significant digits, not decimals: a deep static decoder's bottom layers get orders of magnitude less
    return [float(f"{x:.4g}") for x in (norms / batches).tolist()]


def gradients(args):
    for seed in args.seeds:
        for system in args.systems:
            for update in args.updates:
                row = {"system": system, "setting": args.setting, "seed": seed, "update": update,
                       "decoder_layer_grad_norms": layer_gradient_norms(args, system, seed, update)}
                with open(args.gradients_results, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"| {system} seed {seed} update {update}: {row['decoder_layer_grad_norms']}", flush=True)


def source_use(args, system: str, seed: int) -> dict:
    """Validation nll (bits per target token, eval mode: a latent model's own inference) of the run's
    last checkpoint with each sentence's own source (``nll``) and with the sources of each batch
    rolled by one sentence (``nll_rolled``): how much of its prediction the source carries, whatever
    beam search makes of it. A diagnostic of this study (docs/claims.md, "Two seeds"), no equation
    of the paper's.

    Raises:
        FileNotFoundError: if the run has no ``checkpoint_last.pt``."""
    task, model, criterion, itr = at_update(args, system, seed, -1)
    model.eval()
    nll, rolled, tokens = 0.0, 0.0, 0
    with torch.no_grad():
        for sample in itr:
            other = {k: v.roll(1, 0) if k in ("src_tokens", "src_lengths") else v
                     for k, v in sample["net_input"].items()}
            nll += float(criterion(model, sample)[2]["nll_loss"])
            rolled += float(criterion(model, {**sample, "net_input": other})[2]["nll_loss"])
            tokens += int(sample["ntokens"])
    return {"system": system, "setting": args.setting, "seed": seed,
            "nll": round(nll / tokens / math.log(2), 3), "nll_rolled": round(rolled / tokens / math.log(2), 3)}


def sources(args):
    """One JSON line of :func:`source_use` per run of ``--systems`` x ``--seeds`` in ``--setting``."""
    for seed in args.seeds:
        for system in args.systems:
            print(json.dumps(source_use(args, system, seed)), flush=True)


def save(fig, out: Path):
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"| wrote {out}")


def figure(args):
    """Fig. 2's plot: each decoder layer's gradient norm (log scale; the mean over seeds, dots per
    seed), one panel per update point, one line per system and setting."""
    from fairseq_widearch.plotting import pyplot
    rows = read_rows(args.gradients_results)
    updates = sorted({r["update"] for r in rows})
    plt = pyplot()
    columns = min(3, len(updates))
    rows_of_panels = math.ceil(len(updates) / columns)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=(5 * columns, 4 * rows_of_panels), squeeze=False,
                             sharey=True)
    axes = axes.flatten()
    for unused in axes[len(updates):]:
        unused.set_visible(False)
    # one colour per system and setting in every panel, though a panel may lack some of them
    colours = {key: f"C{i}" for i, key in enumerate(sorted({(r["system"], r["setting"]) for r in rows}))}
    for ax, update in zip(axes, updates):
        here = [r for r in rows if r["update"] == update]
        for key in sorted({(r["system"], r["setting"]) for r in here}):
            runs = [r["decoder_layer_grad_norms"] for r in here if (r["system"], r["setting"]) == key]
            layers = range(1, len(runs[0]) + 1)
            ax.plot(layers, [statistics.mean(v) for v in zip(*runs)], color=colours[key], label=" ".join(key))
            for run in runs:
                ax.plot(layers, run, ".", color=colours[key], alpha=0.5)
        ax.set_yscale("log")
        ax.set_title("initialisation" if update == 0 else f"update {update}")
        ax.set_xlabel("decoder layer (1 = bottom)")
    axes[0].set_ylabel("gradient norm of the layer's parameters")
    axes[0].legend()
    save(fig, args.out)


def translation_curve(row: dict) -> list:
    """A row's label-smoothed cross-entropy curve: a latent model's ``ce_loss`` (its loss adds the KL
    and depth terms), a static model's loss."""
    return row.get("ce_loss_curve") or row["loss_curve"]


def translation_diverged(row: dict) -> bool:
    """The rule's verdict on :func:`translation_curve` (a latent row's ``diverged`` judges its whole
    loss, ``divergence_ce`` its translation term)."""
    return bool(row["divergence_ce"]) if "ce_loss_curve" in row else row["diverged"]


def curves(args):
    """Training loss against updates of every row of ``--systems`` in ``--results``: one panel per
    setting (in :data:`SETTINGS`' order), one line per run (:func:`translation_curve`), a diverged
    one (:func:`translation_diverged`) ending in an x at its last finite loss, and the token-frequency
    level ``--frequency-level`` as a dashed line if given: Fig. 3's comparison.

    Raises:
        SystemExit: if ``--results`` has no row of ``--systems``."""
    from fairseq_widearch.plotting import pyplot
    rows = [r for r in read_rows(args.results) if r["system"] in args.systems]
    if not rows:
        raise SystemExit(f"no rows of {','.join(args.systems)} in {args.results}")
    settings = [s for s in SETTINGS if any(r["setting"] == s for r in rows)]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 4), squeeze=False, sharey=True)
    colours = {system: f"C{i}" for i, system in enumerate(args.systems)}  # one per system in every panel
    for ax, setting in zip(axes[0], settings):
        labelled = set()
        for row in (r for r in rows if r["setting"] == setting):
            finite = ([(u, loss) for u, loss in translation_curve(row) if not isinstance(loss, str)]
                      or [(0, float("nan"))])
            colour = colours[row["system"]]
            ax.plot(*zip(*finite), color=colour, alpha=0.8, label=None if row["system"] in labelled else row["system"])
            labelled.add(row["system"])
            if translation_diverged(row):
                ax.plot(*finite[-1], "x", color=colour, markersize=10)
        if args.frequency_level:
            ax.axhline(args.frequency_level, color="grey", linestyle="--", linewidth=1,
                       label="token frequencies only (an nll)")
        ax.set_title(setting)
        ax.set_xlabel("update")
        ax.legend()
    axes[0][0].set_ylabel("label-smoothed cross-entropy (bits per token)")
    save(fig, args.out)


def last_tenth(row: dict) -> float:
    """The mean of :func:`translation_curve` over the last tenth of a row's updates (bits per token)."""
    return statistics.mean(loss for update, loss in translation_curve(row)
                           if update > row["max_update"] - row["max_update"] // 10)


def bleu_by_pair(row: dict) -> dict:
    """A row's sacreBLEU per pair in its one decoding mode (static, or a latent model's soft)."""
    (scores,) = row["bleu"].values()
    return scores


def mean_bleu(row: dict) -> float:
    """A row's BLEU averaged over the pairs (:func:`bleu_by_pair`)."""
    return statistics.mean(bleu_by_pair(row)[p] for p in PAIRS)


def table(args):
    """Markdown: one line per system of ``--systems`` in ``--setting``, its seeds' rows averaged (mean
    ± sd, a diverged run's included: its BLEU says how little it learnt), then every pair of systems'
    gaps in mean BLEU and last-tenth loss against the seeds' spread (:func:`gap`).

    Raises:
        SystemExit: if a system has no row in ``--setting``, or a row there has no BLEU yet."""
    rows = [r for r in read_rows(args.results) if r["setting"] == args.setting]
    by_system = {s: sorted((r for r in rows if r["system"] == s), key=lambda r: r["seed"]) for s in args.systems}
    for system, runs in by_system.items():
        if not runs or any("bleu" not in r for r in runs):
            raise SystemExit(f"{system} in {args.setting}: no rows, or a row without BLEU (decode it with `run`)")
    print("| system | seeds | the rule's verdict | mean loss over the last tenth | "
          + " | ".join(f"BLEU en→{p}" for p in PAIRS) + " | mean BLEU |")
    print("|---|---|---|---|" + "---|" * (len(PAIRS) + 1))
    bleu = {s: [mean_bleu(r) for r in runs] for s, runs in by_system.items()}
    loss = {s: [last_tenth(r) for r in runs] for s, runs in by_system.items()}
    for system, runs in by_system.items():
        verdicts = ", ".join("diverged" if translation_diverged(r) else "trained" for r in runs)
        pairs = [mean_spread([bleu_by_pair(r)[p] for r in runs]) for p in PAIRS]
        print(f"| {system} | {','.join(str(r['seed']) for r in runs)} | {verdicts} | {mean_spread(loss[system])} | "
              + " | ".join(pairs) + f" | **{mean_spread(bleu[system])}** |")
    print()
    for i, a in enumerate(args.systems):
        for b in args.systems[i + 1:]:
            print(f"- {a} − {b}: mean BLEU {gap(bleu[a], bleu[b])}; loss over the last tenth {gap(loss[a], loss[b])}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["run", "gradients", "figure", "curves", "table", "sources"])
    p.add_argument("--systems", default="static_24,static_12,lld_24", type=lambda s: s.split(","))
    p.add_argument("--seeds", default="1,2", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--setting", default="released", choices=SETTINGS)
    p.add_argument("--max-update", type=int, default=2000)
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one CPU thread each")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the runs train and decode (cuda: every job on the one GPU); the same "
                        "settings either way (gradients: on the CPU)")
    p.add_argument("--decode", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--frequency-level", type=float,
                   help="curves: the loss of a model that knows only each target language's token "
                        "frequencies (bits per token; docs/claims.md gives the command), drawn dashed")
    p.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "depth")
    p.add_argument("--data", type=Path, help="the prepared one-to-many data (bin/, bpe/codes, test.ref.*; "
                                             "examples/multi30k/prepare.py --tgt de,fr,cs); default WORK/data, "
                                             "prepared there if missing")
    p.add_argument("--results", type=Path, default=ROOT / "docs" / "data" / "latent_depth_regime.jsonl")
    p.add_argument("--updates", default="0", type=lambda s: [int(x) for x in s.split(",")],
                   help="gradients: the points (0 = initialisation, else an interval checkpoint's update)")
    p.add_argument("--gradients-results", type=Path, default=ROOT / "docs" / "data" / "latent_depth_gradients.jsonl")
    p.add_argument("--out", type=Path, help="figure, curves: the PNG (default docs/img/latent_depth_gradients.png, "
                                            "latent_depth_curves.png)")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = ROOT / "docs" / "img" / ("latent_depth_curves.png" if args.command == "curves"
                                            else "latent_depth_gradients.png")
    args.data = args.data or args.work_dir / "data"
    {"run": run, "gradients": gradients, "figure": figure, "curves": curves, "table": table,
     "sources": sources}[args.command](args)


if __name__ == "__main__":
    main()
