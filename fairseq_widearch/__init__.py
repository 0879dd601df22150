"""fairseq-widearch: wide-instead-of-deep Transformer architectures as a fairseq plugin.

Importing this package (``--user-dir fairseq_widearch``) registers every model, architecture
preset, criterion and task, and lets torch >= 2.6 load fairseq checkpoints safely
(:mod:`fairseq_widearch.checkpoint_loading`).
"""
from .checkpoint_loading import allow_fairseq_checkpoint_globals, name_unreadable_checkpoints

allow_fairseq_checkpoint_globals()
name_unreadable_checkpoints()

from . import criterions, models, modules, tasks  # noqa: E402  (registration)

__version__ = "0.1.0"
__all__ = ["criterions", "models", "modules", "tasks", "allow_fairseq_checkpoint_globals"]
