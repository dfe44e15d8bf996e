"""Input/output: tokenizers and checkpoint files."""
