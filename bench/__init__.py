"""Benchmarks: medians and ratios against baselines measured in the same run.

``python -m bench`` runs every bench module present; ``python -m bench.bench_control`` one.
"""
