"""``fairseq-train`` as one torchrun worker that fails on purpose once, and prints what it trains on.

With ``FAULTS`` (``kill@u,stop@v,...``) and ``FAULT_RANK`` r in the environment, the worker of
rank r, in the group's attempt i (torchrun's ``TORCHELASTIC_RESTART_COUNT``), makes the i-th fault:
it sends itself SIGKILL (dies) or SIGSTOP (hangs) as it starts that update. Every worker prints the
sentence ids of each batch it starts training on, ``| batch <attempt> <rank> <update> <ids>``
(update counted from 1), so that a test can tell what an interrupted run replayed or skipped.
With ``FAULT=copy`` and ``FAULT_COPY`` n, the worker writes half of its n-th file copy (fairseq
copies each saved checkpoint to ``checkpoint_last.pt``) and sends itself SIGKILL. Started by hand
(testing_utils.ddp_train), not by torchrun, it is also tests/helpers/ddp_worker.py: every rank saves."""
import os
import shutil
import signal
import sys

from fairseq.trainer import Trainer
from fairseq_cli.train import cli_main

if "TORCHELASTIC_RESTART_COUNT" not in os.environ and "--distributed-rank" in sys.argv:
    import ddp_worker  # noqa: F401  (its patches: every rank saves its checkpoint)

train_step = Trainer.train_step


def printed_train_step(self, samples, raise_oom=False):
    update, rank = self.get_num_updates() + 1, self.data_parallel_rank
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ids = sorted(i for s in samples if s for i in s["id"].tolist())
    # one write: under PYTHONUNBUFFERED, print's text and newline are two, which the peer's can split
    sys.stdout.write(f"| batch {attempt} {rank} {update} {','.join(map(str, ids))}\n")
    sys.stdout.flush()
    faults = [f.split("@") for f in os.environ.get("FAULTS", "").split(",") if f]
    if attempt < len(faults) and rank == int(os.environ["FAULT_RANK"]) and update == int(faults[attempt][1]):
        os.kill(os.getpid(), {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}[faults[attempt][0]])
    return train_step(self, samples, raise_oom)


Trainer.train_step = printed_train_step
copyfile, copies = shutil.copyfile, []


def copy_cut_short(src, dst, **kwargs):
    copies.append(dst)
    if os.environ.get("FAULT") == "copy" and len(copies) == int(os.environ["FAULT_COPY"]):
        with open(src, "rb") as f, open(dst, "wb") as out:
            data = f.read()
            out.write(data[:len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return copyfile(src, dst, **kwargs)


shutil.copyfile = copy_cut_short

if __name__ == "__main__":
    cli_main()
