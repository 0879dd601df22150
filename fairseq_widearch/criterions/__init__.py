"""Training criteria (auxiliary losses are read from the model's ``extra`` output)."""
__all__ = []
