"""MLPerf `deepseekv3_671b`: DeepSeek-V3 671B mixture-of-experts pretraining on C4, continued from
a checkpoint (Training 6.0 and 6.1)."""
