"""Tasks."""
__all__ = []
