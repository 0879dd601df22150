"""Tasks."""
from . import scalable_translation
from .scalable_translation import ScalableTranslationTask

__all__ = ["scalable_translation", "ScalableTranslationTask"]
