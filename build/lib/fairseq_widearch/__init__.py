"""fairseq-widearch: wide-instead-of-deep Transformer architectures as a fairseq plugin.

Importing this package (``--user-dir fairseq_widearch``) registers every model, architecture
preset, criterion and task, and applies the fixes of fairseq's silent errors that
``FAIRSEQ_WIDEARCH_FIXES`` selects (``fairseq_widearch.fairseq_fixes``; all by default).
"""
from .checkpoint_loading import upgrade_loaded_configs
from .fairseq_fixes import apply_fixes

upgrade_loaded_configs()
apply_fixes()

from . import criterions, models, modules, tasks  # noqa: E402  (registration)

__version__ = "0.1.0"
__all__ = ["criterions", "models", "modules", "tasks", "apply_fixes"]
