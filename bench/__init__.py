"""Benchmarks: figures and ratios against a raw baseline measured in the same run."""
