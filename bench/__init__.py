"""Benchmarks (see README: Benchmarks)."""
