"""Provides the MLPerf log keys and values the checker reads, as `mlperf_logging.mllog.constants`
names them.

Importing `mlperf_logging.mllog.constants` runs `mlperf_logging.mllog`'s package import, which
loads numpy (about 50 ms, a quarter of a whole official check); the checker needs only these
strings. tests/compliance/test_keys.py holds them equal to the official constants.
"""

BLOCK_START = "block_start"
BLOCK_STOP = "block_stop"
EPOCH_COUNT = "epoch_count"
EPOCH_NUM = "epoch_num"
EPOCH_START = "epoch_start"
EPOCH_STOP = "epoch_stop"
EVAL_ACCURACY = "eval_accuracy"
EVAL_START = "eval_start"
EVAL_STOP = "eval_stop"
GLOBAL_BATCH_SIZE = "global_batch_size"
RUN_START = "run_start"
RUN_STOP = "run_stop"
SUBMISSION_BENCHMARK = "submission_benchmark"
SUBMISSION_DIVISION = "submission_division"
SUCCESS = "success"
TRAIN_SAMPLES = "train_samples"
