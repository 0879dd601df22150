"""fairseq-train that prints, after every update, the dtypes the trainer holds:
``| update {"params": [...], "master": [...], "optimizer": NAME, "loss": L}`` (``params``: the
model's parameters, ``master``: the optimizer's fp32 master copy, [] without one), so that a
test can see what ``--bf16`` trains in. Arguments: fairseq-train's."""
import json

from fairseq.trainer import Trainer
from fairseq_cli.train import cli_main

step = Trainer.train_step


def master_dtypes(optimizer) -> list:
    master = getattr(optimizer, "fp32_params", None)  # FP16Optimizer: a flat tensor, a list, or lists per device
    if master is None:
        return []
    tensors = [master] if hasattr(master, "dtype") else master
    tensors = [t for ts in tensors.values() for t in ts] if isinstance(tensors, dict) else tensors
    return sorted({str(t.dtype) for t in tensors})


def train_step(self, samples, raise_oom=False):
    out = step(self, samples, raise_oom)
    print("| update " + json.dumps({"params": sorted({str(p.dtype) for p in self.model.parameters()}),
                                    "master": master_dtypes(self.optimizer),
                                    "optimizer": type(self.optimizer).__name__,
                                    "loss": float(out["loss"]) if out else None}), flush=True)
    return out


Trainer.train_step = train_step

if __name__ == "__main__":
    cli_main()
