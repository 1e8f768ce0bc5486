"""MLPerf `qwen35_397b_grpo`: Qwen3.5-397B-A17B agentic GRPO post-training on software-repair tasks
(Training 6.1)."""
