"""Provides `SSDBenchmark`: MLPerf's SSD-ResNet34 object detection on COCO (box mAP >= 0.23)."""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from benchmarks.ssd import coco_metric, postprocess
from benchmarks.ssd import config as config_lib
from benchmarks.ssd import input as input_lib
from benchmarks.ssd import loss as loss_lib
from benchmarks.ssd import model as model_lib
from mlperf_tf.benchmark import Benchmark
from mlperf_tf.data import pipeline
from mlperf_tf.errors import DataError, UserError
from mlperf_tf.facts import Calibration, Conv, Rcp, SimulatorShape
from mlperf_tf.layers import model_bn_span
from mlperf_tf.optimizers import PiecewiseConstantWithWarmup, registry
from mlperf_tf.spmd import SpatialLayout

# Offset of the synthetic eval examples' seeds, so they differ from the training batch's.
_SYNTHETIC_EVAL_SEED = 1_000_000


# The simulator's constants of this benchmark per system family (`mlperf-tf simulate`), each
# from the published result it names (docs/scaling.md: one MLPerf result per benchmark at most
# calibrates; the rest of data/published.json tests). Efficiencies are fractions of the dense
# peak of the calibrating run's number format.
SIMULATOR_CALIBRATION = (
    Calibration(("tpu-v3",), 0.5286, "bf16", "MLPerf v0.6 Google/results/tpu-v3-32/ssd",
                per_chip_batch=4, input_samples_per_s_per_host=4000),
    Calibration(("tpu-v4",), None, "bf16", "assumed: the system's default efficiency",
                per_chip_batch=8, input_samples_per_s_per_host=10000),
    Calibration(("ampere",), None, "fp16", "assumed: the system's default efficiency",
                per_chip_batch=56, input_samples_per_s_per_host=15000),
)  # fmt: skip


class SSDBenchmark(Benchmark):
    """SSD300 with MLPerf's ResNet-34 backbone; quality is COCO box mAP@[.5:.95] (pycocotools).

    Per replica: `compute_loss` matches the padded ground truth to the default boxes and
    returns the reference's loss summed over the replica's images, divided by the global
    micro-batch, plus its share of the L2 weight decay. `eval_step` returns each image's
    top-200 detections after per-class NMS; the host turns them into COCO json rows and scores
    them with COCOeval against the eval annotations json.
    """

    name = "ssd"
    mlperf_benchmark = "ssd"
    sample_unit = "image"
    config_class = config_lib.SSDConfig
    input_module = input_lib  # synthetic training batches (the base class's per-shard hook)
    # --spatial_partition=K (KxL): each replica of a group of K (K x L) holds a slab of rows (a
    # tile) of every image.
    parallel_axes = ("data", "spatial")
    # "ssd" is SSD-ResNet34 up to 1.1.0 and RetinaNet from 2.0.0 (Adam, target 0.34 mAP): the
    # rounds of the same rule-file name that are this model.
    mlperf_rounds = ("0.7.0", "1.0.0", "1.1.0")
    convergence = Rcp("training_1.1.0/rcps_ssd.json", "ssd_ref_")
    presets = {
        "mlperf": config_lib.mlperf,
        "mini": config_lib.mini,
        "smoke": config_lib.smoke,
    }

    def __init__(self, config: config_lib.SSDConfig, **kwargs):
        super().__init__(config, **kwargs)
        try:
            self.default_boxes = model_lib.default_boxes(config.model)
        except ValueError as e:
            raise UserError(str(e)) from None
        self._groundtruth = None

    def simulator_shape(self) -> SimulatorShape:
        """For `--spatial_partition`: SSD-ResNet34's convolutions by feature map (the 7 x 7 stem;
        ResNet-34's basic blocks to conv4, kept at stride 8; the first extra 3 x 3 with the heads
        on that map; then each extra map's next 3 x 3 and its class and box heads) and the batch
        norms a spatial group sums.

        The batch-norm count, 37, is the simulator's since its first version (the figures of
        docs/scaling.md); the built `mlperf` model has 29 (stem, two per block, two projection
        shortcuts).
        """
        m, size = self.config.model, self.config.model.image_size

        def width(channels: int) -> int:
            return max(1, int(round(channels * m.width_scale)))

        quarter = math.ceil(math.ceil(size / 2) / 2)  # after the stride-2 stem and max pool
        side = math.ceil(quarter / 2)  # conv3_x (stride 2); conv4_x stays (stride 1 in SSD)
        b1, b2, b3 = m.backbone_blocks
        convs = [
            Conv(1, 7, size, size, 3, stride=2),
            Conv(2 * b1, 3, quarter, quarter, width(64)),
            Conv(2 * b2, 3, side, side, width(128)),
            Conv(2 * b3, 3, side, side, width(256)),
            Conv(2, 3, side, side, width(256)),
        ]
        extras = zip(m.extra_channels, m.extra_strides, m.extra_paddings)
        for channels, stride, padding in list(extras)[:-1]:
            side = (side + 2 * padding - 3) // stride + 1
            convs.append(Conv(3, 3, side, side, width(channels)))
        return SimulatorShape(
            convs=tuple(convs), batch_norms=37, precision="bf16", calibration=SIMULATOR_CALIBRATION
        )

    # ---- model and optimizer -------------------------------------------------------------------
    def build_model(self) -> keras.Model:
        """SSD of `config.model`, split into K slabs of rows (K x L tiles) over the mesh's
        spatial axis when it has one (`model.build_ssd`)."""
        layout = SpatialLayout(self.mesh) if self.mesh.spatial > 1 else None
        return model_lib.build_ssd(self.config.model, layout)

    def learning_rate_schedule(self) -> PiecewiseConstantWithWarmup:
        """The reference's warmup then x0.1 at each boundary epoch (in optimizer steps)."""
        opt = self.config.optimizer
        boundaries = [
            max(1, int(round(e * self.steps_per_epoch)))
            for e in opt.opt_learning_rate_decay_boundary_epochs
        ]
        multipliers = [opt.learning_rate_decay_factor ** (k + 1) for k in range(len(boundaries))]
        return PiecewiseConstantWithWarmup(
            opt.base_learning_rate(self.config.global_batch_size),
            warmup_steps=opt.opt_learning_rate_warmup_steps,
            warmup_factor=opt.opt_learning_rate_warmup_factor,
            boundaries=boundaries,
            multipliers=multipliers,
        )

    def build_optimizer(self, train_steps: int) -> keras.optimizers.Optimizer:
        """SGD with momentum on the warmup + step schedule; weight decay is in the loss."""
        del train_steps  # the schedule is in epochs, not relative to the run length
        opt = self.config.optimizer
        # SGD is the registry's plug-in too (its momentum is this config's `momentum`, without
        # Nesterov); `opt_params` are for the other optimizers.
        params = () if opt.opt_name == "sgd" else opt.opt_params
        return registry.build(opt.opt_name, self.learning_rate_schedule(), opt, params)

    def restore_initial_weights(self, model: keras.Model) -> None:
        """Loads `model.backbone_checkpoint` (a `.weights.h5` of the backbone) if set.

        Raises:
          DataError: the file does not exist.
          UserError: the file does not hold this backbone's weights (layers or shapes differ).
        """
        path = self.config.model.backbone_checkpoint
        if not path:
            return
        if not os.path.isfile(path):
            raise DataError(f"backbone checkpoint '{path}' does not exist")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", UserWarning)
                model.get_layer("backbone").load_weights(path)
        except (ValueError, KeyError, OSError) as e:
            raise self._checkpoint_error(path, str(e)) from None
        # Keras only warns when it skips parts of the file: a partial load is an error here.
        skipped = [w for w in caught if issubclass(w.category, UserWarning)]
        if skipped:
            raise self._checkpoint_error(path, str(skipped[0].message))

    def _checkpoint_error(self, path: str, reason: str) -> UserError:
        reason = reason.strip().splitlines()[0] if reason.strip() else "unreadable"
        return UserError(
            f"backbone checkpoint '{path}' does not fit this model's backbone "
            f"(model.backbone_blocks={self.config.model.backbone_blocks}, "
            f"width_scale={self.config.model.width_scale}): {reason}"
        )

    # ---- data ----------------------------------------------------------------------------------
    def record_train_data(self, input_context, batch_size: int) -> tf.data.Dataset:
        cfg = self.config
        files = pipeline.list_files(
            os.path.join(cfg.data_dir, cfg.data.train_pattern), what="SSD train"
        )
        seed = self.seed

        def transform(example):
            # One stateless seed per example, drawn from the pipeline's seeded random stream.
            example_seed = tf.random.uniform([2], 0, 2**31 - 1, tf.int64, seed=seed)
            return input_lib.train_transform(cfg, example, example_seed)

        return pipeline.training_pipeline(
            files,
            input_context=input_context,
            parse_fn=input_lib.parse_record,
            transform_fn=transform,
            batch_size=batch_size,
            shuffle_buffer=cfg.data.shuffle_buffer,
            seed=seed,
            cache=cfg.data.cache_train,
            skip_bad_records=self.skip_bad_records,
        )

    def synthetic_eval_data(self, input_context, batch_size: int, num_batches: int):
        pipelines = input_context.num_input_pipelines if input_context else 1
        index = input_context.input_pipeline_id if input_context else 0
        examples = [self._synthetic_eval_example(i) for i in range(self.config.eval_examples)]
        examples = examples[index::pipelines]
        keys = ("image", "source_id", "height", "width")
        stacked = {k: np.stack([e[k] for e in examples]) for k in keys}
        return pipeline.pad_eval_dataset(
            tf.data.Dataset.from_tensor_slices(stacked),
            batch_size=batch_size,
            num_batches=num_batches,
        )

    def record_eval_data(self, input_context, batch_size: int, num_batches: int):
        cfg = self.config
        files = pipeline.list_files(
            os.path.join(cfg.data_dir, cfg.data.eval_pattern), what="SSD eval"
        )
        return pipeline.eval_pipeline(
            files,
            input_context=input_context,
            parse_fn=input_lib.parse_record,
            transform_fn=lambda example: input_lib.eval_transform(cfg, example),
            batch_size=batch_size,
            num_batches=num_batches,
            skip_bad_records=self.skip_bad_records,
        )

    def _synthetic_eval_example(self, index: int) -> dict[str, np.ndarray]:
        return input_lib.synthetic_example(self.config, _SYNTHETIC_EVAL_SEED + index)

    # ---- steps (replica context) -----------------------------------------------------------------
    def loss_terms(self, model: keras.Model, batch: dict, training: bool) -> loss_lib.LossTerms:
        """The per-image loss terms of one per-replica batch (replica context)."""
        box_codes, class_logits = model(batch["image"], training=training)
        return loss_lib.ssd_loss(
            box_codes,
            class_logits,
            batch["boxes"],
            batch["classes"],
            self.default_boxes,
            iou_threshold=self.config.loss.match_iou_threshold,
            negative_ratio=self.config.loss.negative_ratio,
        )

    def compute_loss(self, model: keras.Model, batch: dict, training: bool = True) -> tf.Tensor:
        """Sum of per-image losses / global micro-batch, plus L2 / batch shards (replica context).

        The reference averages its per-image loss over the batch and lets SGD add
        `weight_decay * w` to every gradient; summing this over replicas gives the same. With
        spatial partitioning the K replicas of a group see the same images' (gathered) outputs
        and each returns this same loss: the runner counts the group once
        (`Benchmark.compute_loss`).
        """
        terms = self.loss_terms(model, batch, training)
        loss = tf.reduce_sum(terms.total) / float(self.micro_batch_size)
        wd = self.config.optimizer.opt_weight_decay
        if wd > 0:
            squares = [
                tf.reduce_sum(tf.square(tf.cast(v, loss.dtype))) for v in model.trainable_variables
            ]
            loss += 0.5 * wd * tf.add_n(squares) / float(self.batch_shards)
        return loss

    def eval_step(self, model: keras.Model, batch: dict) -> dict[str, tf.Tensor]:
        """Top detections of each image of the per-replica batch (replica context)."""
        box_codes, class_logits = model(batch["image"], training=False)
        ev = self.config.eval
        detections = postprocess.detect(
            box_codes,
            class_logits,
            self.default_boxes,
            nms_iou_threshold=ev.nms_iou_threshold,
            score_threshold=ev.score_threshold,
            max_candidates_per_class=ev.max_candidates_per_class,
            max_detections=ev.max_detections,
        )
        valid = tf.cast(batch["valid"], tf.float32)
        return {
            "boxes": detections["boxes"],
            "scores": detections["scores"] * valid[:, None],
            "classes": detections["classes"],
            "source_id": tf.cast(batch["source_id"], tf.int64),
            "height": tf.cast(batch["height"], tf.int32),
            "width": tf.cast(batch["width"], tf.int32),
            "valid": valid,
        }

    # ---- host side -------------------------------------------------------------------------------
    def eval_begin(self) -> dict[str, list]:
        return {"rows": [], "image_ids": []}

    def eval_reduce(self, state: dict[str, list], outputs: dict[str, np.ndarray]) -> dict:
        """Appends the COCO result rows of the real (non-padding) images."""
        real = np.asarray(outputs["valid"]) > 0
        image_ids = np.asarray(outputs["source_id"])[real]
        state["image_ids"].extend(int(i) for i in image_ids)
        state["rows"].append(
            coco_metric.detection_rows(
                image_ids=image_ids,
                heights=np.asarray(outputs["height"])[real],
                widths=np.asarray(outputs["width"])[real],
                boxes=np.asarray(outputs["boxes"])[real],
                scores=np.asarray(outputs["scores"])[real],
                classes=np.asarray(outputs["classes"])[real],
                category_ids=self.config.data.category_ids,
            )
        )
        return state

    def eval_result(self, state: dict[str, list]) -> float:
        """COCO box mAP@[.5:.95] of the gathered detections (pycocotools)."""
        rows = np.concatenate(state["rows"]) if state["rows"] else np.zeros((0, 7))
        return coco_metric.box_map(self.groundtruth(), rows, state["image_ids"])

    def groundtruth(self):
        """The eval ground truth (pycocotools `COCO`), loaded once."""
        if self._groundtruth is None:
            cfg = self.config
            if cfg.synthetic:
                self._groundtruth = coco_metric.groundtruth_from_dict(self._synthetic_groundtruth())
            else:
                path = cfg.data.val_annotations
                if not os.path.isabs(path):
                    path = os.path.join(cfg.data_dir, path)
                self._groundtruth = coco_metric.load_groundtruth(path)
        return self._groundtruth

    def _synthetic_groundtruth(self) -> dict:
        """COCO instances of the synthetic eval examples (so smoke runs score real mAP)."""
        cfg = self.config
        images, annotations = [], []
        for i in range(cfg.eval_examples):
            ex = self._synthetic_eval_example(i)
            size = float(cfg.model.image_size)
            images.append({"id": int(ex["source_id"]), "height": int(size), "width": int(size)})
            for box, cls in zip(ex["boxes"], ex["classes"]):
                if cls <= 0:
                    continue
                ymin, xmin, ymax, xmax = (float(v) * size for v in box)
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": int(ex["source_id"]),
                        "category_id": int(cfg.data.category_ids[cls - 1]),
                        "bbox": [xmin, ymin, xmax - xmin, ymax - ymin],
                        "area": (xmax - xmin) * (ymax - ymin),
                        "iscrowd": 0,
                    }
                )
        categories = [{"id": int(c), "name": str(c)} for c in cfg.data.category_ids]
        return {"images": images, "annotations": annotations, "categories": categories}

    def mlperf_hparams(self) -> dict[str, Any]:
        """The keys closed_ssd.yaml (MLPerf 0.7.0 / 1.0.0) requires, from the config."""
        cfg = self.config
        opt = cfg.optimizer
        factor = opt.opt_learning_rate_warmup_factor
        optimizer_keys = (
            registry.mlperf_hparams(opt.opt_name, opt, opt.opt_params)
            if opt.opt_name != "sgd"
            else {}
        )
        return {
            **optimizer_keys,
            C.MODEL_BN_SPAN: model_bn_span(self.per_replica_batch_size, cfg.model.bn_group_size),
            C.OPT_BASE_LR: opt.base_learning_rate(cfg.global_batch_size),
            C.OPT_WEIGHT_DECAY: opt.opt_weight_decay,
            C.OPT_LR_WARMUP_STEPS: opt.opt_learning_rate_warmup_steps,
            C.OPT_LR_WARMUP_FACTOR: int(factor) if float(factor).is_integer() else factor,
            C.OPT_LR_DECAY_BOUNDARY_EPOCHS: list(opt.opt_learning_rate_decay_boundary_epochs),
            C.MAX_SAMPLES: cfg.data.max_samples,
        }

    @classmethod
    def prepare_mini(cls, data_dir: str) -> None:
        from benchmarks.ssd import prepare  # noqa: PLC0415 (keeps `python -m ...prepare` clean)

        prepare.prepare_mini(data_dir)
