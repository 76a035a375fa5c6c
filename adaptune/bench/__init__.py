"""Benchmarks, JSON out: `python -m adaptune.bench.cpu` (make bench) and `python -m adaptune.bench.gpu` (make bench-gpu)."""
