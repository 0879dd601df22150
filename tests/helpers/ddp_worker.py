"""fairseq-train for one DDP rank that also saves a checkpoint on non-master ranks, so a test can
compare the parameters every rank ends with (fairseq saves on rank 0 only)."""
from fairseq.trainer import Trainer
from fairseq_cli.train import cli_main

Trainer.should_save_checkpoint_on_current_rank = property(lambda self: True)

if __name__ == "__main__":
    cli_main()
