"""Benchmarks for the proxy (``python -m bench.run``); see BENCHMARKS.md for the latest results."""
