"""MLPerf llama31_8b: Llama 3.1 8B pretraining on C4 (log perplexity) with AdamW."""

from benchmarks.llama31_8b.benchmark import Llama31Benchmark

__all__ = ["Llama31Benchmark"]
