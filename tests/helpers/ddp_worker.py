"""fairseq-train for one DDP rank that also saves a checkpoint on non-master ranks, so a test can
compare the parameters every rank ends with (fairseq saves on rank 0 only).

With ``--ddp-backend pytorch_ddp`` (fairseq's GPU default) fairseq builds PyTorch's
``DistributedDataParallel`` with ``device_ids=[--device-id]``, which PyTorch refuses for a CPU
module; on CPU this worker builds the same wrapper with ``device_ids=None`` (everything else,
``find_unused_parameters`` included, as fairseq passes it)."""
from torch.nn.parallel import DistributedDataParallel

from fairseq.models import distributed_fairseq_model
from fairseq.trainer import Trainer
from fairseq_cli.train import cli_main

Trainer.should_save_checkpoint_on_current_rank = property(lambda self: True)


class CPUDistributedDataParallel(DistributedDataParallel):
    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        super().__init__(module, device_ids=None, output_device=None, **kwargs)


distributed_fairseq_model.DistributedDataParallel = CPUDistributedDataParallel

if __name__ == "__main__":
    cli_main()
