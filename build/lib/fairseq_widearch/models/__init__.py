"""Architectures, one module each: every module of this folder is imported, as fairseq imports its
own models, and so registers its model and presets with fairseq."""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
