"""fairseq-widearch: wide-instead-of-deep Transformer architectures as a fairseq plugin.

Importing this package (``--user-dir fairseq_widearch``) registers every model, architecture
preset, criterion and task, lets torch >= 2.6 load fairseq checkpoints safely
(``fairseq_widearch.checkpoint_loading``), and fixes fairseq's silent errors
(``fairseq_widearch.fairseq_fixes``: every sentence batched, no auxiliary loss dropped,
``--patience`` kept across a resumed run, no update past ``--max-update`` on a rerun, ``--amp``'s
loss-scale flags obeyed, ``--bf16`` without a TPU, in training and decoding, torchrun's workers in one group (restarted groups
included; BMUF given their world size), ``pytorch_ddp`` on CPUs, a hung worker
ended by ``--heartbeat-timeout``, checkpoint copies written whole or not at all, no abort at exit
from fairseq's prefetching thread).
"""
from .checkpoint_loading import allow_fairseq_checkpoint_globals, name_unreadable_checkpoints
from .fairseq_fixes import (amp_loss_scaler_flags, bf16_inference, bf16_without_tpu, finished_runs_stay_finished,
                            keep_last_batch, require_auxiliary_criterion, resume_patience, torchrun_joins_one_group,
                            bmuf_world_size, pytorch_ddp_on_cpu, heartbeat_ends_a_hung_job, checkpoint_copies_are_atomic, prefetching_stops_at_exit,
                            help_lists_model_flags, presets_reach_the_criterion)

allow_fairseq_checkpoint_globals()
name_unreadable_checkpoints()
keep_last_batch()
require_auxiliary_criterion()
resume_patience()
finished_runs_stay_finished()
amp_loss_scaler_flags()
bf16_without_tpu()
bf16_inference()
torchrun_joins_one_group()
bmuf_world_size()
pytorch_ddp_on_cpu()
heartbeat_ends_a_hung_job()
checkpoint_copies_are_atomic()
prefetching_stops_at_exit()
help_lists_model_flags()
presets_reach_the_criterion()

from . import criterions, models, modules, tasks  # noqa: E402  (registration)

__version__ = "0.1.0"
__all__ = ["criterions", "models", "modules", "tasks", "allow_fairseq_checkpoint_globals"]
