"""MLPerf `gpt_oss_20b`: GPT-OSS 20B mixture-of-experts pretraining on C4 (Training 6.0 and 6.1)."""
