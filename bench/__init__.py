"""The benchmarks, their drivers, their JSON and the dated log (LOG.md), outside the library: `python -m bench.cpu` (make bench),
`python -m bench.gpu` (make bench-gpu), ... (README.md lists them). Imports adaptune, components and pipelines; nothing
but the tests imports it, and it never imports the tests (stand_ins/ holds what both use)."""
