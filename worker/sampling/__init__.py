"""Sampling: the `Sampler` and its per-request state, penalties, n-gram bans, top-k/top-p,
seeded random streams, logprobs, and the CUDA graphs that replay small random draws.

Structured outputs (`structured/`) and speculative decoding (`spec_decode/`) are its neighbours,
on the same floor.
"""
