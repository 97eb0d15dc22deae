"""Benchmarks and their helpers; bench/README.md lists every script and how to run it."""
