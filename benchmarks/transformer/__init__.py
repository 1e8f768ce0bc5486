"""Provides MLPerf's Transformer translation benchmark (WMT English->German, uncased BLEU)."""

from benchmarks.transformer.benchmark import TransformerBenchmark

__all__ = ["TransformerBenchmark"]
