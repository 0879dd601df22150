"""Tasks: every module of this folder is imported, as fairseq imports its own tasks, and so
registers its task with fairseq."""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
