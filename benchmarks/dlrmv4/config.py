"""Provides `DlrmConfig`, the DLRMv4 (HSTU on Yambda-5b) benchmark's frozen config, and its presets.

The MLPerf reference is `recommendation_v4/` of `mlcommons/training` (PR #889; read at commit
a67b8459): Meta's generative-recommenders `DlrmHSTU` on TorchRec. The model's shape is what
`dlrm_v4/configs.py` (`get_hstu_configs("yambda-5b")`, `get_embedding_table_config`) and
`dlrm_v4/train/gin/yambda_5b.gin` set; the README's table gives each field its path there.
The closed rules are mlperf-logging's `training_6.1.0/closed_dlrmv4.yaml`.
"""

from __future__ import annotations

import dataclasses
import math
import os

from mlperf_tf import paths
from mlperf_tf.config import MAX_INT, BenchmarkConfig, ConfigError, require

NAME = "dlrmv4"

# What the 6.1.0 closed rules fix (closed_dlrmv4.yaml).
TRAIN_SAMPLES = 2_290_835_423
EVAL_SAMPLES = 2_058_204
MAX_SEQUENCE_LENGTH = 4096
TARGET_AUC = 0.75
EVAL_EVERY_DATA_PCT = 0.001
WARMUP_STEPS = 24_000
REFERENCE_LR_PER_SAMPLE = 1e-6 / 8192  # the band's centre: 1e-6 * global_batch_size / 8192
LR_BAND = (0.5, 1.5)

RCP_FILE = "rcp_checker/training_6.1.0/rcps_dlrmv4.json"

# configs.py YAMBDA_5B_CROSS_SPECS: the seven hashed cross features (name, rows), each one
# contextual token after `uid`.
CROSS_FEATURES = (
    ("user_x_artist", 100_000_000),
    ("user_x_album", 40_000_000),
    ("user_x_hour", 24_000_000),
    ("item_x_hour", 40_000_000),
    ("artist_x_hour", 32_000_000),
    ("user_x_is_organic", 2_000_000),
    ("user_x_artist_x_hour", 40_000_000),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """DlrmHSTU's shape; the defaults are the reference's yambda-5b model.

    Attributes:
      item_rows, artist_rows, album_rows, uid_rows: rows of the four id tables (configs.py
        `get_embedding_table_config`); item, artist and album serve both the history and the
        candidate features.
      cross_rows: rows of the seven cross-feature tables, in `CROSS_FEATURES` order.
      embedding_dim: every table's width (`HSTU_EMBEDDING_DIM`).
      preprocessor_hidden_dim: the preprocessor MLPs' hidden width.
      transducer_dim: the HSTU stack's width D (`hstu_transducer_embedding_dim`).
      num_heads, attn_linear_dim, attn_qk_dim, num_layers: the STU layers (H, d_v, d_qk, and
        `HSTU_NUM_LAYERS` of the gin file).
      max_seq_len: contextual tokens + history + candidate (`MAX_SEQ_LEN`).
      num_position_buckets, num_time_buckets: the positional encoder's tables.
      input_dropout, linear_dropout: dropout after the positional encoder and in each STU
        layer's output.
      action_embedding_dim: width of each action type's embedding (3 types: listen+, like,
        skip, the bits 1, 2, 4 of `action_weight`).
      mlp_hidden_dim: the item MLP's and the prediction head's hidden width (512).
      embedding_memory_gb: the most one replica may hold of the tables and their row-wise
        Adagrad state, in GiB (0: unchecked); the tables split over `--expert_parallel`
        replicas (`mlperf_tf.layers.sharded_embedding`), and more than this per replica is a
        one-line error at build.
      weight_scale: every trainable weight (tables included) stored divided by this and read
        times it (`model.ScaledDlrmHstu`, `mlperf_tf.lm.parametrization`): Adam and row-wise
        Adagrad at the rules' rate then move the weights as at this many times that rate. 1:
        the plain model (the `mlperf` preset); the `mini` sets it.
    """

    item_rows: int = 9_390_624
    artist_rows: int = 1_293_395
    album_rows: int = 3_367_692
    uid_rows: int = 1_000_001
    cross_rows: tuple[int, ...] = tuple(rows for _, rows in CROSS_FEATURES)
    embedding_dim: int = 512
    preprocessor_hidden_dim: int = 256
    transducer_dim: int = 512
    num_heads: int = 4
    attn_linear_dim: int = 128
    attn_qk_dim: int = 128
    num_layers: int = 3
    max_seq_len: int = MAX_SEQUENCE_LENGTH
    num_position_buckets: int = 8192
    num_time_buckets: int = 2048
    input_dropout: float = 0.2
    linear_dropout: float = 0.1
    action_embedding_dim: int = 8
    num_action_types: int = 3
    mlp_hidden_dim: int = 512
    embedding_memory_gb: float = 0.0
    weight_scale: float = 1.0

    def __post_init__(self):
        require(
            self,
            prefix="model.",
            positive_int=(
                "item_rows", "artist_rows", "album_rows", "uid_rows", "embedding_dim",
                "preprocessor_hidden_dim", "transducer_dim", "num_heads", "attn_linear_dim",
                "attn_qk_dim", "num_layers", "max_seq_len", "num_position_buckets",
                "num_time_buckets", "action_embedding_dim", "num_action_types", "mlp_hidden_dim",
            ),
            fraction=("input_dropout", "linear_dropout"),
            non_negative=("embedding_memory_gb",),
            positive=("weight_scale",),
        )  # fmt: skip
        if len(self.cross_rows) != len(CROSS_FEATURES) or any(
            isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in self.cross_rows
        ):
            raise ConfigError(
                f"`model.cross_rows` ({self.cross_rows!r}) must be {len(CROSS_FEATURES)} "
                "positive integers"
            )
        if self.history_length < 1:
            raise ConfigError(
                f"`model.max_seq_len` ({self.max_seq_len}) leaves no room for a history after "
                f"{self.num_contextual} contextual tokens and the candidate"
            )

    @property
    def num_contextual(self) -> int:
        """Contextual tokens before the history: `uid` and the seven cross features."""
        return 1 + len(self.cross_rows)

    @property
    def history_length(self) -> int:
        """The longest history a sample keeps (yambda.py's `uih_seq_len_budget`)."""
        return self.max_seq_len - 1 - self.num_contextual

    def table_rows(self) -> dict[str, int]:
        """Table name -> rows, every embedding table of the model."""
        tables = {
            "item_id": self.item_rows,
            "artist_id": self.artist_rows,
            "album_id": self.album_rows,
            "uid": self.uid_rows,
        }
        tables.update({name: rows for (name, _), rows in zip(CROSS_FEATURES, self.cross_rows)})
        return tables


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """Dense Adam and sparse row-wise Adagrad as the closed rules fix them; fields are log keys.

    `opt_base_learning_rate` 0 means the rules' reference rate 1e-6 x global batch / 8192; a
    rate outside 0.5-1.5x of it is an error unless `lr_band_check` is off (scaled presets). The
    sparse optimizer runs at the same rate (`opt_sparse_base_learning_rate`). The rate ramps
    linearly from `opt_learning_rate_warmup_start_lr` over `opt_learning_rate_warmup_steps`.
    """

    opt_name: str = "Adam"
    opt_base_learning_rate: float = 0.0
    opt_adam_beta_1: float = 0.95
    opt_adam_beta_2: float = 0.999
    opt_adam_epsilon: float = 1e-8
    opt_weight_decay: float = 0.0
    opt_gradient_clip_norm: float = 1.0
    opt_sparse_name: str = "RowWiseAdagrad"
    opt_sparse_epsilon: float = 1e-8
    opt_learning_rate_warmup_steps: int = WARMUP_STEPS
    opt_learning_rate_warmup_start_lr: float = 0.0
    lr_band_check: bool = True

    def __post_init__(self):
        require(
            self,
            prefix="optimizer.",
            non_negative=(
                "opt_base_learning_rate", "opt_adam_epsilon", "opt_weight_decay",
                "opt_gradient_clip_norm", "opt_sparse_epsilon",
                "opt_learning_rate_warmup_start_lr",
            ),
            non_negative_int=("opt_learning_rate_warmup_steps",),
            fraction=("opt_adam_beta_1", "opt_adam_beta_2"),
        )  # fmt: skip
        if self.opt_name != "Adam" or self.opt_sparse_name != "RowWiseAdagrad":
            raise ConfigError(
                "`optimizer.opt_name` must be 'Adam' and `optimizer.opt_sparse_name` "
                f"'RowWiseAdagrad' (got {self.opt_name!r}, {self.opt_sparse_name!r})"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """The streaming time windows.

    Attributes:
      window_seconds: one training window's span (gin `streaming_window_seconds`, a day).
      num_train_windows: windows trained in time order (gin `NUM_TRAIN_TS`); the eval set is
        the window after them (`EVAL_HOLDOUT_TS`).
      eval_every_data_pct: the eval interval as a fraction of `train_examples`.
      first_eval_samples: samples before the first eval; -1: the rules' formula
        (closed_dlrmv4.yaml: the reference sweep's earliest convergence less two blocks).
    """

    window_seconds: int = 86_400
    num_train_windows: int = 299
    eval_every_data_pct: float = EVAL_EVERY_DATA_PCT
    first_eval_samples: int = -1

    def __post_init__(self):
        require(
            self,
            prefix="data.",
            positive_int=("window_seconds", "num_train_windows"),
            positive=("eval_every_data_pct",),
        )
        if (
            isinstance(self.first_eval_samples, bool)
            or not isinstance(self.first_eval_samples, int)
            or self.first_eval_samples < -1
        ):
            raise ConfigError(
                f"`data.first_eval_samples` ({self.first_eval_samples!r}) must be -1 or >= 0"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DlrmConfig(BenchmarkConfig):
    """DLRMv4 (MLPerf `dlrmv4`). Sizes are in samples (one listen event with its history).

    One epoch is the whole training stream (`train_examples`, `max_epochs` 1): the windows in
    time order, each once. Evaluations run every `data.eval_every_data_pct` of it on the held
    out future window (`eval_examples`), from `data.first_eval_samples` on.
    """

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)

    def __post_init__(self):
        # The stream is 2,290,835,423 samples, above the int32 bound `BenchmarkConfig` holds
        # counts to (they are int32 in compiled loops; this one never enters one: the steps,
        # 279,643 at batch 8192, do). Checked against int64 here, the rest by the base class.
        stream = self.train_examples
        if isinstance(stream, int) and not isinstance(stream, bool) and MAX_INT < stream < 2**53:
            object.__setattr__(self, "train_examples", MAX_INT)
            try:
                super().__post_init__()
            finally:
                object.__setattr__(self, "train_examples", stream)
        else:
            super().__post_init__()
        lr = self.learning_rate
        if self.optimizer.lr_band_check:
            low, high = (f * REFERENCE_LR_PER_SAMPLE * self.global_batch_size for f in LR_BAND)
            if not low * (1 - 1e-9) <= lr <= high * (1 + 1e-9):
                raise ConfigError(
                    f"`optimizer.opt_base_learning_rate` ({lr:g}) is outside the rules' band "
                    f"[{low:g}, {high:g}] for `global_batch_size` {self.global_batch_size} "
                    "(0.5-1.5 x 1e-6 x batch / 8192)"
                )

    @property
    def learning_rate(self) -> float:
        """The base rate: the configured one, or the rules' 1e-6 x batch / 8192 when 0."""
        lr = self.optimizer.opt_base_learning_rate
        return lr or REFERENCE_LR_PER_SAMPLE * self.global_batch_size

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps over the training stream (the last batch of the stream completed
        from the next window, as the reference's streaming loader does)."""
        return math.ceil(self.train_examples / self.global_batch_size)

    @property
    def eval_interval_steps(self) -> int:
        """ceil(eval_every_data_pct x train_examples / batch): the reference's
        `data_pct_to_global_steps`, which the rules recompute."""
        every = self.data.eval_every_data_pct * self.train_examples / self.global_batch_size
        return max(1, math.ceil(every))

    @property
    def first_eval_samples(self) -> int:
        """Samples at the first eval: the configured count rounded up to the eval grid, or the
        rules' threshold floor((4480 x batch + 135,331,840) / 3) rounded up to it."""
        interval = self.eval_interval_steps * self.global_batch_size
        first = self.data.first_eval_samples
        if first < 0:
            first = (4480 * self.global_batch_size + 135_331_840) // 3
        return max(1, math.ceil(first / interval)) * interval


def rcp_reference() -> dict[int, float]:
    """Batch -> base LR of the reference convergence points (the rules' linear law)."""
    return {batch: REFERENCE_LR_PER_SAMPLE * batch for batch in (8192, 16384, 32768)}


# ---- presets ------------------------------------------------------------------------------------


def mlperf() -> DlrmConfig:
    """The MLPerf closed-division run: the reference model on Yambda-5b at global batch 8192
    (LR 1e-6, 24,000 warm-up steps), prepared by `mlperf-tf prepare dlrmv4`.

    Command: `mlperf-tf run --benchmark=dlrmv4 --preset=mlperf --model_dir=DIR
    --config.data_dir=YAMBDA_RECORDS`. Hardware: the tables hold 293.1 M rows x 512 fp32
    (600 GB; row-wise Adagrad adds 1.2 GB): 8+ accelerators with sharded tables (see
    README.md). Expected: AUC 0.75 after about 68.8 M samples (the BS-8192 RCPs' mean).
    """
    return DlrmConfig(
        global_batch_size=8192,
        eval_batch_size=8192,
        train_examples=TRAIN_SAMPLES,
        eval_examples=EVAL_SAMPLES,
        max_epochs=1.0,
        quality_target=TARGET_AUC,
        # An 80 GB accelerator's memory: the 600 GB of tables need 8+ replicas on `expert`.
        model=ModelConfig(embedding_memory_gb=80.0),
        data_dir=os.path.join(paths.data_root(), "dlrmv4-yambda"),
    )


# The mini data set's shapes (`mini_stream.MiniStream` generates them, `prepare.prepare_mini`
# writes its eval window). The stream is 1,000 of the rules' eval intervals long (an eval every
# 0.1 % of it, `eval_every_data_pct` 0.001, is one every 16,384 samples = 128 steps) and a run
# reads its start only: the days are generated as the run reaches them, never written.
MINI_ITEMS = 2000
MINI_ARTISTS = 50
MINI_ALBUMS = 400
MINI_USERS = 200
MINI_CROSS_ROWS = (16384,) * len(CROSS_FEATURES)
MINI_MAX_SEQ_LEN = 48
MINI_WINDOW_SAMPLES = 32768  # listens a day
MINI_TRAIN_WINDOWS = 500
MINI_TRAIN_SAMPLES = MINI_TRAIN_WINDOWS * MINI_WINDOW_SAMPLES  # 16,384,000
MINI_EVAL_SAMPLES = 16384  # the day after the stream
MINI_BATCH = 128
# The first eval at the fourth interval (the rules' formula is the 2.29 B stream's: 45 M).
MINI_FIRST_EVAL_SAMPLES = 4 * 16384
MINI_TARGET_AUC = TARGET_AUC  # the rules' 0.75 (the popularity baseline: README "mini")
# The mini trains at the rules' learning rate and warm-up (1e-6 x 128 / 8192 ramped over 24,000
# steps: the ~900 steps it takes to its target all inside the ramp) on weights stored divided by this
# (`model.ScaledDlrmHstu`): as Adam and row-wise Adagrad at this many times the logged rate.
MINI_WEIGHT_SCALE = 1.2e7


def mini_model() -> ModelConfig:
    """The reference's design at a CPU's scale: 2 STU layers of width 32, 2 heads of 16."""
    return ModelConfig(
        item_rows=MINI_ITEMS,
        artist_rows=MINI_ARTISTS,
        album_rows=MINI_ALBUMS,
        uid_rows=MINI_USERS,
        cross_rows=MINI_CROSS_ROWS,
        embedding_dim=32,
        preprocessor_hidden_dim=32,
        transducer_dim=32,
        num_heads=2,
        attn_linear_dim=16,
        attn_qk_dim=16,
        num_layers=2,
        max_seq_len=MINI_MAX_SEQ_LEN,
        num_position_buckets=128,
        num_time_buckets=256,
        mlp_hidden_dim=64,
        weight_scale=MINI_WEIGHT_SCALE,
    )


def mini() -> DlrmConfig:
    """Generated listening sessions whose tastes drift by day (`mini_stream.MiniStream`):
    2,000 items, 200 users, histories of up to 39 events, a stream of 500 training days of
    32,768 listens (16,384,000; generated as the run reads them) and the day after it, 16,384
    listens, as the fixed eval window (`prepare.prepare_mini`).

    Command: `mlperf-tf run --benchmark=dlrmv4 --preset=mini --model_dir=/tmp/dlrm_mini`.
    Hardware: 2 CPU cores. Keeps the rules' optimizers, betas, clip, learning rate (1e-6 x 128 /
    8192) and warm-up (24,000 steps from 0), on weights stored divided by `MINI_WEIGHT_SCALE`
    (the rules' rate would not move a small model in minutes), the rules' target (AUC 0.75) and
    eval grid (every 0.1 % of the stream: 128 steps); scales the first eval (65,536 samples: the
    rules' formula is the 2.29 B stream's). Expected: see README.md ("mini").
    """
    return DlrmConfig(
        global_batch_size=MINI_BATCH,
        eval_batch_size=512,
        train_examples=MINI_TRAIN_SAMPLES,
        eval_examples=MINI_EVAL_SAMPLES,
        max_epochs=1.0,
        quality_target=MINI_TARGET_AUC,
        model=mini_model(),
        data=DataConfig(
            window_seconds=86_400,
            num_train_windows=MINI_TRAIN_WINDOWS,
            eval_every_data_pct=EVAL_EVERY_DATA_PCT,
            first_eval_samples=MINI_FIRST_EVAL_SAMPLES,
        ),
        # "-3": the generated stream of 500 days (`mini_stream`); "-2" was 5 written days.
        data_dir=os.path.join(paths.data_root(), "dlrmv4-mini-3"),
    )


def smoke() -> DlrmConfig:
    """Synthetic batches and a one-layer model of width 16: a few steps, seconds.

    Command: `mlperf-tf run --benchmark=dlrmv4 --preset=smoke --model_dir=/tmp/dlrm_smoke`.
    Hardware: any CPU. Expected: well under a minute; the AUC is meaningless.
    """
    return DlrmConfig(
        global_batch_size=16,
        eval_batch_size=16,
        train_examples=16 * 8,
        eval_examples=32,
        max_epochs=1.0,
        quality_target=TARGET_AUC,
        model=ModelConfig(
            item_rows=64,
            artist_rows=16,
            album_rows=32,
            uid_rows=32,
            cross_rows=(64,) * len(CROSS_FEATURES),
            embedding_dim=16,
            preprocessor_hidden_dim=16,
            transducer_dim=16,
            num_heads=2,
            attn_linear_dim=8,
            attn_qk_dim=8,
            num_layers=1,
            max_seq_len=24,
            num_position_buckets=64,
            num_time_buckets=64,
            mlp_hidden_dim=16,
        ),
        optimizer=OptimizerConfig(
            opt_base_learning_rate=1e-3, opt_learning_rate_warmup_steps=2, lr_band_check=False
        ),
        data=DataConfig(num_train_windows=2, eval_every_data_pct=0.5, first_eval_samples=0),
    )
