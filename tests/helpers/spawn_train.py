"""``python -m fairseq_cli.train`` whose workers fairseq's own spawn starts (``--distributed-world-size
N`` without torchrun), on the CPU. fairseq spawns one worker per visible GPU and, on a machine
without, refuses ("world size is N but have 0 available devices"): here it is told N devices are
there; the workers it spawns train with ``--cpu`` and gloo as they would on N GPUs."""
import runpy
import sys

import torch

world_size = int(sys.argv[sys.argv.index("--distributed-world-size") + 1])
torch.cuda.device_count = lambda: world_size  # the spawning process alone: the workers use the CPU

if __name__ == "__main__":
    sys.argv[0] = "python -m fairseq_cli.train"
    runpy.run_module("fairseq_cli.train", run_name="__main__", alter_sys=True)
