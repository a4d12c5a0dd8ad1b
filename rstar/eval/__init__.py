"""Evaluation: the paper's benchmarks as data, its protocol's metrics, reports and analyses."""
