"""Command-line tools (``python -m fairseq_widearch.cli.<tool>``)."""
