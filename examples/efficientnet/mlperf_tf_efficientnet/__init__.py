"""EfficientNet as an mlperf-tf benchmark, installed as its own package (entry point `efficientnet`)."""
