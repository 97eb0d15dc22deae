"""Model families: one decoder (decoder.py) and its tensor-parallel layers (parallel.py)."""
