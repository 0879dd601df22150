#!/usr/bin/env python
"""Compare the stock pre-norm Transformer and the five wide architectures on Multi30k En->De.

    python examples/compare/compare.py --data BIN --bpe-codes CODES --ref REFERENCE
        [--minutes 10] [--work-dir runs/compare] [--systems a,b,...] [--figure PNG]

Every system trains with the same flags, seed and CPU wall-clock budget (``--stop-time-hours``),
then ``checkpoint_last.pt`` decodes test_2016 with the same beam settings through
``fairseq-generate``. Per system (per width for the scalable model) it records:

* ``params`` and ``macs`` (one teacher-forced 20 + 20-token pair; ``fairseq_widearch.cli.stats``);
* ``train_tokens_per_s``: target tokens per second of training, from fairseq's per-epoch ``wps``;
* ``train_flops_per_token``: FLOPs of real training steps (forward and backward, every
  sub-Transformer of a scalable update) per target token, counted by ``torch.utils.flop_counter``
  on the first training batches;
* ``utilisation``: ``train_flops_per_token × train_tokens_per_s`` over this machine's fp32 peak,
  the best rate of a large ``torch.matmul`` measured at the start of the same run;
* ``decode_sentences_per_s`` (fairseq-generate's own timing) and sacreBLEU with its signature.

Results are appended to ``WORK/results.jsonl`` (a system already there is skipped; an interrupted
training resumes), then printed as a markdown table and drawn as BLEU against MACs in ``--figure``.
"""
import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import fairseq_widearch  # noqa: F401  (registers the architectures, allows loading their checkpoints)
from fairseq_widearch.cli.plotting import pyplot
from fairseq_widearch.cli.stats import count_macs, matmul_peak_flops, param_counts, sub_transformer_param_counts

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "multi30k"))
from score import corpus_bleu, generate  # noqa: E402  (the quick start's decoding and scoring)

#: Optimisation and regularisation shared by every system (also examples/claims/study.py).
OPTIMISATION = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.003", "--lr-scheduler", "inverse_sqrt",
                "--warmup-updates", "300", "--label-smoothing", "0.1", "--dropout", "0.1", "--attention-dropout", "0.1",
                "--activation-dropout", "0.1", "--max-tokens", "4096"]
COMMON = ["--cpu", "--num-workers", "0", "--seed", "1", *OPTIMISATION, "--max-epoch", "100", "--no-epoch-checkpoints",
          "--log-format", "simple", "--log-interval", "50"]
BODY = ["--encoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "4", "--share-all-embeddings"]
SCALABLE = ["--arch", "scalable_transformer_multi30k", "--encoder-embed-dim", "192", "--encoder-ffn-embed-dim",
            "768", "--encoder-attention-heads", "3", "--decoder-attention-heads", "3",
            "--scalable-widths", "64,128,192", "--width-dropout", "", "--task", "scalable_translation",
            "--criterion", "scalable_self_distillation"]
#: name -> fairseq-train flags. The transformer is the shared Multi30k body with 4 + 4 layers, so
#: its parameter count (2.9M) sits with the wide models' (2.3-3.2M; the scalable model's 128-wide
#: sub-Transformer 3.0M, its widest 4.8M).
SYSTEMS = {
    "transformer": ["--arch", "transformer", *BODY, "--encoder-layers", "4", "--decoder-layers", "4",
                    "--encoder-normalize-before", "--decoder-normalize-before",
                    "--criterion", "label_smoothed_cross_entropy"],
    "multipath_transformer": ["--arch", "multipath_transformer_multi30k", "--criterion", "label_smoothed_cross_entropy"],
    "widenet": ["--arch", "widenet_multi30k", "--criterion", "moe_label_smoothed_cross_entropy",
                "--moe-balance-weight", "0.01"],
    "latent_depth_transformer": ["--arch", "latent_depth_transformer_multi30k",
                                 "--criterion", "latent_depth_label_smoothed_cross_entropy",
                                 "--latent-kl-weight", "1.0", "--latent-kl-anneal-updates", "300"],
    "partialformer": ["--arch", "partialformer_multi30k", "--criterion", "label_smoothed_cross_entropy"],
    "scalable_transformer": SCALABLE,
}
SCALABLE_WIDTHS = (64, 128, 192)
#: Scalable Transformers train in stages (Gao et al. 2021, Sec. 3.3): stage 1 (Eq. 6) for this
#: share of the budget, then stage 2 (Eq. 7, lambda_2 annealed over 100 updates) from it with a
#: fresh Adam warming up from half the peak learning rate. Stage 3 is left out: decoding the
#: training set would cost more than the budget.
SCALABLE_STAGE1_SHARE = 0.6


_EPOCH = re.compile(r"\| train \| epoch \d+ \|.*")


def training_tokens_per_s(*logs: str) -> float:
    """Target tokens per second over every epoch of one or more fairseq-train logs: Σ tokens / Σ time,
    an epoch's tokens being ``wpb × updates`` and its time ``tokens / wps`` (epochs whose ``wps``
    rounds to 0, a single update, are left out).

    Raises:
        ValueError: if the logs hold no epoch summary with a throughput.
    """
    tokens = seconds = 0.0
    for log in logs:
        previous_updates = 0
        for line in _EPOCH.findall(log):
            fields = dict(f.strip().split(" ", 1) for f in line.split("|")[3:] if " " in f.strip())
            updates, wps = int(float(fields["num_updates"])), float(fields["wps"])
            if wps:
                epoch_tokens = float(fields["wpb"]) * (updates - previous_updates)
                tokens, seconds = tokens + epoch_tokens, seconds + epoch_tokens / wps
            previous_updates = updates
    if not seconds:
        raise ValueError("no '| train | epoch' summary with a throughput in the fairseq-train log")
    return tokens / seconds


def training_updates(*logs: str) -> int:
    """Updates over one or more fairseq-train logs (each stage counts from 0)."""
    return sum(int(re.findall(r"\| num_updates (\d+)", log)[-1]) for log in logs)


class _Backward:
    """The one optimizer method a task's ``train_step`` calls."""

    @staticmethod
    def backward(loss):
        loss.backward()


def training_flops_per_token(checkpoint: Path, data: str, batches: int = 4, update_num: int = 1000) -> float:
    """FLOPs of ``batches`` training steps (forward + backward through the task's ``train_step``,
    the checkpoint's own criterion) per target token, counted by ``torch.utils.flop_counter``
    (attention through the math SDPA kernel so its matmuls are seen)."""
    from fairseq import checkpoint_utils
    [model], cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides={"data": data})
    criterion = task.build_criterion(cfg.criterion)
    task.load_dataset("train")
    iterator = task.get_batch_iterator(task.dataset("train"), max_tokens=cfg.dataset.max_tokens, seed=1,
                                       max_positions=model.max_positions()).next_epoch_itr(shuffle=True)
    counter, tokens = FlopCounterMode(display=False), 0
    with sdpa_kernel(SDPBackend.MATH), counter:
        for _, sample in zip(range(batches), iterator):
            task.train_step(sample, model, criterion, _Backward(), update_num)
            tokens += sample["ntokens"]
    return counter.get_total_flops() / tokens


def model_size(checkpoint: Path, data: str, width: int = 0) -> dict:
    """``params`` and ``macs`` (20 + 20 tokens) of a trained model, or of its sub-Transformer of ``width``."""
    from fairseq import checkpoint_utils
    [model], _ = checkpoint_utils.load_model_ensemble([str(checkpoint)], arg_overrides={"data": data})
    if width:
        model.set_sample_config(width)
    params = sub_transformer_param_counts(model) if width else param_counts(model)
    return {"params": params["params"], "macs": count_macs(model)}


def decode(args, checkpoint: Path, out: Path, width: int = 0) -> dict:
    """Decode test_2016 with fairseq-generate; sentences/s (its own timing) and sacreBLEU."""
    task = ["--task", "scalable_translation", "--eval-width", width] if width else []
    log = generate(args.data, checkpoint, out, args.bpe_codes, args.beam, args.lenpen, *task)
    speed = re.search(r"Translated .* \(([\d.]+) sentences/s", log)
    score, signature = corpus_bleu(out, args.ref)
    return {"decode_sentences_per_s": float(speed.group(1)), "bleu": round(score.score, 2),
            "bleu_signature": str(signature)}


def train(args, flags, save: Path, minutes: float, *extra) -> str:
    """Run fairseq-train until ``minutes`` of (cumulative) training; returns its log."""
    save.mkdir(parents=True, exist_ok=True)
    cmd = [Path(sys.executable).parent / "fairseq-train", args.data, "--user-dir", ROOT / "fairseq_widearch",
           *COMMON, *flags, "--stop-time-hours", f"{minutes / 60:.6f}", "--save-dir", save, *extra]
    with open(save / "train.log", "a") as log:
        subprocess.run([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, check=True)
    return (save / "train.log").read_text()


def train_system(args, name: str) -> list:
    """Train one system for ``--minutes`` (the scalable model in two stages); returns its logs."""
    save = args.work_dir / name
    if name != "scalable_transformer":
        return [train(args, SYSTEMS[name], save, args.minutes)]
    stage1 = save / "stage1"
    log = train(args, SYSTEMS[name], stage1, args.minutes * SCALABLE_STAGE1_SHARE, "--distill-stage", "1")
    return [log, train(args, SYSTEMS[name], save, args.minutes, "--distill-stage", "2",
                       "--lambda2-anneal-updates", "100", "--warmup-init-lr", "0.0015",
                       "--finetune-from-model", stage1 / "checkpoint_last.pt")]


def run_system(args, name: str, peak: float) -> list:
    """Train, measure and decode one system: one result row, or one per width of the scalable model."""
    logs = train_system(args, name)
    checkpoint = args.work_dir / name / "checkpoint_last.pt"
    tokens_per_s = training_tokens_per_s(*logs)
    flops_per_token = training_flops_per_token(checkpoint, args.data)
    training = {"minutes": args.minutes, "updates": training_updates(*logs), "train_tokens_per_s": round(tokens_per_s, 1),
                "train_flops_per_token": round(flops_per_token), "matmul_peak_gflops": round(peak / 1e9, 1),
                "utilisation": round(flops_per_token * tokens_per_s / peak, 4)}
    widths = SCALABLE_WIDTHS if name == "scalable_transformer" else (0,)
    rows = []
    for width in widths:
        label = f"{name} w{width}" if width else name
        out = args.work_dir / name / f"generate{'-w%d' % width if width else ''}.txt"
        rows.append({"system": label, "width": width, **model_size(checkpoint, args.data, width), **training,
                     **decode(args, checkpoint, out, width)})
    return rows


def table(rows) -> str:
    head = ("| system | params | MACs (20+20) | updates | train tokens/s | utilisation | decode sent/s | BLEU |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [f"| {r['system']} | {r['params'] / 1e6:.2f}M | {r['macs'] / 1e6:.1f}M | {r['updates']} | "
             f"{r['train_tokens_per_s']:,.0f} | "
             f"{100 * r['utilisation']:.1f}% | {r['decode_sentences_per_s']:.1f} | {r['bleu']:.2f} |" for r in rows]
    return "\n".join([head, *lines])


def plot(rows, path: Path):
    """BLEU against MACs: one point per system, the scalable model's widths joined as a curve."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    scalable = sorted((r for r in rows if r["width"]), key=lambda r: r["macs"])
    for i, r in enumerate(r for r in rows if not r["width"]):
        ax.scatter(r["macs"] / 1e6, r["bleu"], s=40)
        ax.annotate(r["system"], (r["macs"] / 1e6, r["bleu"]), textcoords="offset points", fontsize=8,
                    xytext=(6, 4 if i % 2 == 0 else -11))  # alternate above/below: close points stay readable
    if scalable:
        ax.plot([r["macs"] / 1e6 for r in scalable], [r["bleu"] for r in scalable], "k--o", ms=4,
                label="scalable_transformer, widths " + "/".join(str(r["width"]) for r in scalable))
        ax.legend(fontsize=8, loc="center right")
    ax.set_xlabel("MACs per 20+20-token sentence pair (millions)")
    ax.set_ylabel("sacreBLEU, Multi30k test_2016 En→De")
    ax.set_title(f"Same CPU budget ({rows[0]['minutes']:g} min), seed and beam")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def data_arguments(description: str) -> argparse.ArgumentParser:
    """A parser with the Multi30k data flags: ``--data``, ``--bpe-codes``, ``--ref``."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="fairseq data directory (En-De, joined dictionary)")
    p.add_argument("--bpe-codes", required=True)
    p.add_argument("--ref", required=True, help="raw German reference of test_2016")
    return p


def main(argv=None):
    p = data_arguments(__doc__)
    p.add_argument("--minutes", type=float, default=10, help="training wall-clock budget of every system")
    p.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "compare")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ",".join(SYSTEMS))
    p.add_argument("--beam", default="5")
    p.add_argument("--lenpen", default="1.0")
    p.add_argument("--figure", type=Path, help="PNG path (default WORK/bleu_vs_macs.png)")
    args = p.parse_args(argv)
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    results = args.work_dir / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    done = {r["system"].split(" ")[0] for r in rows}
    peak = matmul_peak_flops()  # fp32, this CPU
    print(f"| fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s", flush=True)
    for name in args.systems.split(","):
        if name in done:
            continue
        print(f"| {name}: training for {args.minutes:g} minutes", flush=True)
        new = run_system(args, name, peak)
        with open(results, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in new)
        rows += new
    print(table(rows))
    print(f"BLEU signature: {rows[0]['bleu_signature']}")
    figure = args.figure or args.work_dir / "bleu_vs_macs.png"
    plot(rows, figure)
    print(f"| figure: {figure}")


if __name__ == "__main__":
    main()
