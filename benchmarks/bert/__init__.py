"""MLPerf language benchmark: BERT-large pretraining (masked-LM accuracy) with LAMB."""

from benchmarks.bert.benchmark import BertBenchmark

__all__ = ["BertBenchmark"]
