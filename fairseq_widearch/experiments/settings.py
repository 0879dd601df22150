"""The settings the Multi30k experiments share: the model body, the optimisation flags and the
criterion of an arch. The quick start, the comparison, the claims study, the benchmarks and the
tests take them from here (the latent-depth one-to-many recipe keeps its own, matched to the
authors' example it runs beside).

    python -m fairseq_widearch.experiments.settings criterion ARCH     # the arch's criterion
    python -m fairseq_widearch.experiments.settings quickstart         # its optimisation flags, one per line

Raises:
    SystemExit: (the command line) for an architecture fairseq has not registered, naming it.
"""
import sys
from typing import List, Sequence

#: Adam, its inverse-sqrt schedule with 300 warm-up updates and label smoothing 0.1: every recipe's.
OPTIMISER = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.003", "--lr-scheduler", "inverse_sqrt",
             "--warmup-updates", "300", "--label-smoothing", "0.1"]
#: The quick start's: residual dropout 0.1, 4,096 tokens per batch.
QUICKSTART = [*OPTIMISER, "--dropout", "0.1", "--max-tokens", "4096"]
#: The comparison's and the claims study's: attention and activation dropout 0.1 besides.
OPTIMISATION = [*OPTIMISER, "--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1",
                "--max-tokens", "4096"]
#: The shared Multi30k body: d 128, FFN 512, 4 heads, one embedding for source, target and output.
BODY = ["--encoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "4", "--share-all-embeddings"]
PRE_NORM = ["--encoder-normalize-before", "--decoder-normalize-before"]


def criterion(arch: str) -> str:
    """The criterion that adds ``arch``'s auxiliary losses (``moe_label_smoothed_cross_entropy`` for
    WideNet, ``latent_depth_label_smoothed_cross_entropy`` for latent depth), else
    ``label_smoothed_cross_entropy``.

    Raises:
        KeyError: for an architecture fairseq has not registered.
    """
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_widearch  # noqa: F401  (registers the plugin's architectures)

    return getattr(ARCH_MODEL_REGISTRY[arch], "auxiliary_criterion", None) or "label_smoothed_cross_entropy"


#: How the scalable model trains in its stage 2 (every width, the word-level distillation KL).
SCALABLE_STAGE2_TASK = ["--task", "scalable_translation", "--criterion", "scalable_self_distillation",
                        "--distill-stage", "2"]


def plugin_archs() -> list:
    """The plugin's architectures by their model names (each its base preset's ``--arch``), sorted,
    from fairseq's registry: every list of architectures derives from it."""
    from fairseq.models import MODEL_REGISTRY

    import fairseq_widearch  # noqa: F401  (registers the plugin's architectures)

    return sorted(name for name, cls in MODEL_REGISTRY.items() if cls.__module__.startswith("fairseq_widearch"))


def multi30k_presets() -> list:
    """Every architecture's ``_multi30k`` preset (the quick start's body), in ``plugin_archs`` order."""
    return [f"{arch}_multi30k" for arch in plugin_archs()]


def paper_presets() -> dict:
    """Each architecture -> the preset of its paper's size the benchmarks measure (the model's
    ``paper_preset``, else its base preset)."""
    from fairseq.models import MODEL_REGISTRY

    return {arch: MODEL_REGISTRY[arch].paper_preset or arch for arch in plugin_archs()}


def tiny_cases() -> dict:
    """Every architecture's ``_tiny`` preset -> the flags it trains with beyond its arch: the
    scalable one under its own task and self-distillation criterion in stage 2, the others none."""
    return {f"{arch}_tiny": SCALABLE_STAGE2_TASK if arch.startswith("scalable") else [] for arch in plugin_archs()}


def criterion_flags(flags: Sequence[str]) -> List[str]:
    """``["--criterion", <the criterion of the --arch in flags>]``, or [] when ``flags`` name one."""
    flags = [str(f) for f in flags]
    return [] if "--criterion" in flags else ["--criterion", criterion(flags[flags.index("--arch") + 1])]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["quickstart"]:
        print("\n".join(QUICKSTART))
    elif argv[:1] == ["criterion"] and len(argv) == 2:
        try:
            print(criterion(argv[1]))
        except KeyError:
            sys.exit(f"error: --arch {argv[1]} is not a registered architecture")
    else:
        sys.exit("usage: python -m fairseq_widearch.experiments.settings quickstart | criterion ARCH")


if __name__ == "__main__":
    main()
