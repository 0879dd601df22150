"""fairseq-train for one DDP rank that also saves a checkpoint on non-master ranks, so a test can
compare the parameters every rank ends with (fairseq saves on rank 0 only), and prints the
sub-Transformers the scalable task draws at each update (``| drawn <update> <configs>``), so a
test can compare what every rank trained."""
from fairseq.trainer import Trainer
from fairseq_cli.train import cli_main

from fairseq_widearch.tasks.scalable_translation import ScalableTranslationTask

Trainer.should_save_checkpoint_on_current_rank = property(lambda self: True)
draw = ScalableTranslationTask.sub_transformers


def printed_draw(self, model, update_num):
    configs = draw(self, model, update_num)
    print(f"| drawn {update_num} {configs}", flush=True)
    return configs


ScalableTranslationTask.sub_transformers = printed_draw

if __name__ == "__main__":
    cli_main()
