"""Benchmarks. Each ``bench/bench_*.py`` module has ``main(argv) -> dict`` that measures spark-mq
against a peer in the same run, prints a table and returns the figures (also written as JSON to
``bench/results/<name>.json``). ``python -m bench [names...]`` runs them all or the named ones."""
