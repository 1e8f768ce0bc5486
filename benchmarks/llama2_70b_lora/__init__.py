"""MLPerf llama2_70b_lora: LoRA fine-tuning of Llama 2 70B on SCROLLS GovReport (eval loss)."""

from benchmarks.llama2_70b_lora.benchmark import LoraBenchmark

__all__ = ["LoraBenchmark"]
