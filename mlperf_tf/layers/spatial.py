"""Provides the layers of spatial partitioning: each replica of a spatial group holds a tile of every image.

The layout (`mlperf_tf.parallel.spatial.SpatialLayout`): the K x L replicas of one spatial group
read the same images; the member in tile row `i` and tile column `j` (row-major in the group)
holds rows `[i*H/K, (i+1)*H/K)` and columns `[j*W/L, (j+1)*W/L)` of every split activation
`[batch, H/K, W/L, C]` (L = 1, `--spatial_partition=K`: slabs of rows). Weights are replicated.
Each layer states the collectives it issues, in replica context, on
its `AxisGroup` over the mesh's `spatial` axis (`mlperf_tf.collectives.axis_group`): the group
(`DeviceMesh.group(replica, "spatial")`) or one of its tile columns (K members) or tile rows
(L members):

| layer | forward | backward |
|---|---|---|
| `SpatialSlice` | none (cuts the tile out of the whole image) | none |
| `HaloConv2D`, `HaloMaxPooling2D` | one all-to-all over the tile column: halo rows from the neighbours above and below; then (L > 1) one over the tile row: halo columns, of the row-extended tiles, so the corners come along | the same all-to-alls in reverse order: the halo's gradients back to their owners |
| `SpatialGather` | all-gather of the tiles over the group (the whole tensor on every member) | all-reduce of the gradient, then this tile's part |
| `SpatialGlobalAveragePooling2D` | all-reduce of the tile's sums over the group | all-reduce of the gradient |

Batch norm over tiles needs no layer of its own: `CrossReplicaBatchNormalization` with
`group_size = bn_group_size x K x L` sums its statistics over the tiles and over the
batch-norm group of batch shards (`SpatialBuilder.batch_norm_group`; the group on the mesh is
`mlperf_tf.collectives.axis_group.batch_norm_group`).

Gradients. Every replica's loss is 1/(K L) of its images' loss, and each backward collective is the
adjoint of its forward one, so backpropagation computes, on each replica, the gradient of the
sum of all replicas' losses with respect to that replica's copy of every weight: the partial
gradient from its slab. The runner's gradient summer sums it over the spatial and data axes (the
replicated layout's `sum_over`), which is then the gradient of the global loss
(`mlperf_tf/parallel/README.md`).

The layers need replica ids known at trace time (MirroredStrategy, MultiWorkerMirroredStrategy,
inside a `tf.function`); on TPUs the same layout is `experimental_split_to_logical_devices`.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mlperf_tf.collectives import ops as collective_ops
from mlperf_tf.collectives.axis_group import AxisGroup
from mlperf_tf.parallel import spatial as spatial_lib
from mlperf_tf.parallel.context import current_mesh
from mlperf_tf.parallel.mesh import DeviceMesh
from mlperf_tf.parallel.spatial import SpatialLayout


def _group(layer) -> AxisGroup:
    """`layer`'s spatial group (`layer.spatial_group`), after the checks that name what a tile
    needs: a replica context, with replica ids known at trace time."""
    ctx = tf.distribute.get_replica_context() if tf.distribute.has_strategy() else None
    if ctx is None:
        raise ValueError(
            f"layer '{layer.name}' holds a slab of a spatially partitioned tensor: call it "
            "in the replica context of the run's strategy"
        )
    if collective_ops.static_replica_id(ctx) is None or tf.executing_eagerly():
        raise ValueError(
            f"layer '{layer.name}' needs replica ids known at trace time inside a "
            "tf.function (MirroredStrategy); on TPUs spatial partitioning is "
            "experimental_split_to_logical_devices"
        )
    return layer.spatial_group


def _check_padding(padding, layer: str):
    if padding not in ("same", "valid") and not (
        isinstance(padding, int) and not isinstance(padding, bool) and padding >= 0
    ):
        raise ValueError(
            f"`padding` ({padding!r}) of layer '{layer}' must be 'same', 'valid' or rows >= 0"
        )


class _SlabWindow:
    """Shared by the halo layers: the whole-image padding of a window op, applied to a tile."""

    def get_config(self):
        """The Keras layer's config plus the whole-image padding and the layout."""
        return {**super().get_config(), "padding": self.pad, "layout": self.layout.get_config()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layout"] = SpatialLayout.from_config(config["layout"])
        return cls(**config)

    def _window(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """The window op's (kernel, stride, dilation), each (rows, columns)."""
        raise NotImplementedError

    def _halo_input(self, x, *, edge_value):
        """`x` ([b, h, w, c], a tile; or the whole image when K = L = 1) with its halo rows,
        then its halo columns (of the row-extended tile: the corners come along) or padding:
        what a 'valid' window op turns into this tile's part of the whole op."""
        kernel, stride, dilation = self._window()
        group = None
        for axis, parts in ((1, self.layout.row_parts), (2, self.layout.col_parts)):
            size = x.shape[axis] * parts  # the whole image's (axis 1: before extending)
            before, after = spatial_lib.window_pads(
                size, kernel=kernel[axis - 1], stride=stride[axis - 1],
                dilation=dilation[axis - 1], padding=self.pad,
            )  # fmt: skip
            if parts > 1:
                halo = spatial_lib.halo(
                    height=size, parts=parts, kernel=kernel[axis - 1], stride=stride[axis - 1],
                    dilation=dilation[axis - 1], pad_top=before, pad_bottom=after,
                )  # fmt: skip
                if not (halo.top or halo.bottom):
                    continue
                group = group or _group(self)
                first, last = group.halo(
                    x, top=halo.top, bottom=halo.bottom, edge_value=edge_value, axis=axis
                )
                x = tf.concat([first, x, last], axis=axis)
            elif before or after:
                pads = [[0, 0]] * 4
                pads[axis] = [before, after]
                x = tf.pad(x, pads, constant_values=edge_value)
        return x

    def _slab_output_shape(self, input_shape, *, channels):
        kernel, stride, dilation = self._window()
        out = [input_shape[0]]
        for axis, parts in ((1, self.layout.row_parts), (2, self.layout.col_parts)):
            k, s, d = kernel[axis - 1], stride[axis - 1], dilation[axis - 1]
            size = input_shape[axis] * parts
            pads = spatial_lib.window_pads(size, kernel=k, stride=s, dilation=d, padding=self.pad)
            out.append(((size + sum(pads) - (k - 1) * d - 1) // s + 1) // parts)
        return (*out, channels)


@keras.saving.register_keras_serializable(package="mlperf_tf")
class HaloConv2D(_SlabWindow, keras.layers.Conv2D):
    """`keras.layers.Conv2D` on a tile (a slab of rows when L = 1): its part of the whole
    image's convolution.

    Forward: one all-to-all over the tile column (halo rows from the neighbours above and
    below; none when the window needs no halo, e.g. 1x1), with L > 1 tiles one more over the
    tile row (halo columns of the row-extended tile, so the corners come along), then a 'valid'
    convolution of the tile with its halo or the image's padding. Backward: the same
    all-to-alls in reverse (the halo's gradients back to their owners).
    Kernel, stride and dilation are respected; `SAME` padding (TF's, from the whole image's
    height) or an explicit symmetric padding (PyTorch's, SSD) is reproduced at the image's
    edges. The kernel and bias are the same variables as `Conv2D`'s (names, shapes,
    initializers), so weights move between the split and the whole model.

    Args:
      filters, kernel_size: as `Conv2D`.
      layout: (keyword-only) the spatial layout; `layout.parts == 1` is a plain convolution.
      padding: (keyword-only) "same", "valid", or an int of zero rows and columns on each side.
      **kwargs: the other arguments of `Conv2D` (strides, dilation_rate, use_bias, ...).

    Raises:
      ValueError: at call, when the slabs cannot compute the whole convolution (a slab height
        that is not a multiple of the stride, a halo wider than a slab: `spatial.halo`).
    """

    def __init__(self, filters, kernel_size, *, layout: SpatialLayout, padding="same", **kwargs):
        _check_padding(padding, kwargs.get("name", ""))
        super().__init__(filters, kernel_size, padding="valid", **kwargs)
        self.layout = layout
        self.pad = padding
        self.spatial_group = AxisGroup("spatial", owner=self, mesh=layout.mesh)

    def _window(self):
        return self.kernel_size, self.strides, self.dilation_rate

    def call(self, inputs):
        return super().call(self._halo_input(inputs, edge_value=0.0))

    def compute_output_shape(self, input_shape):
        return self._slab_output_shape(input_shape, channels=self.filters)


@keras.saving.register_keras_serializable(package="mlperf_tf")
class HaloMaxPooling2D(_SlabWindow, keras.layers.MaxPooling2D):
    """`keras.layers.MaxPooling2D` on a tile, with halo rows and columns from the neighbours.

    Collectives as `HaloConv2D` (one all-to-all forward, one backward). "same" pads with -inf
    (Keras' max pooling ignores its padding); an int pads with zeros (SSD's
    `ZeroPadding2D` + 'valid' max pool, equal to PyTorch's -inf padding after a ReLU).

    Args:
      pool_size, strides: as `MaxPooling2D` (strides default to pool_size).
      layout: (keyword-only) the spatial layout.
      padding: (keyword-only) "same", "valid", or an int of zero rows and columns on each side.
      **kwargs: the other arguments of `MaxPooling2D`.
    """

    def __init__(self, pool_size, strides=None, *, layout: SpatialLayout, padding="same", **kwargs):
        _check_padding(padding, kwargs.get("name", ""))
        super().__init__(pool_size, strides=strides, padding="valid", **kwargs)
        self.layout = layout
        self.pad = padding
        self.spatial_group = AxisGroup("spatial", owner=self, mesh=layout.mesh)

    def _window(self):
        return self.pool_size, self.strides, (1, 1)

    def call(self, inputs):
        edge = 0.0 if isinstance(self.pad, int) else float(inputs.dtype.min)
        return super().call(self._halo_input(inputs, edge_value=edge))

    def compute_output_shape(self, input_shape):
        return self._slab_output_shape(input_shape, channels=input_shape[-1])


class _LayoutLayer(keras.layers.Layer):
    def __init__(self, *, layout: SpatialLayout, **kwargs):
        super().__init__(**kwargs)
        self.layout = layout
        self.spatial_group = AxisGroup("spatial", owner=self, mesh=layout.mesh)

    def get_config(self):
        return {**super().get_config(), "layout": self.layout.get_config()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layout"] = SpatialLayout.from_config(config["layout"])
        return cls(**config)


@keras.saving.register_keras_serializable(package="mlperf_tf")
class SpatialSlice(_LayoutLayer):
    """The whole image `[b, H, W, c]` -> this replica's tile `[b, H/K, W/L, c]`. No collective:
    every replica of the group has the whole batch (the runner routes it), so each holds
    the group's input K x L times over (3 channels: small beside the activations it splits)."""

    def call(self, inputs):
        if self.layout.parts == 1:
            return inputs
        (i, j), rows, cols = _group(self).tile(), *self.compute_output_shape(inputs.shape)[1:3]
        return inputs[:, i * rows : (i + 1) * rows, j * cols : (j + 1) * cols]

    def compute_output_shape(self, input_shape):
        rows, cols = self.layout.row_parts, self.layout.col_parts
        return (input_shape[0], input_shape[1] // rows, input_shape[2] // cols, *input_shape[3:])


@keras.saving.register_keras_serializable(package="mlperf_tf")
class SpatialGather(_LayoutLayer):
    """The slabs of the group concatenated along `axis` (tiles: along rows and columns of a
    `[b, h, w, c]` tensor): the whole tensor on every member.

    Forward: one all-gather over the spatial group. Backward: one all-reduce of the gradient
    over the group, then this replica's slice (the adjoint: every member's copy of the whole
    tensor fed its loss share). Use it where the tiles end: an activation too small to split,
    or the SSD heads' per-level outputs.

    Args:
      axis: the split axis (1: rows of `[b, h, w, c]`, or anchors of `[b, anchors, k]`). With
        K x L tiles (L > 1) only `[b, h, w, c]` with `axis=1` (rows and columns).
      layout: (keyword-only) the spatial layout.
    """

    def __init__(self, axis: int = 1, *, layout: SpatialLayout, **kwargs):
        super().__init__(layout=layout, **kwargs)
        self.axis = axis

    def call(self, inputs):
        if self.layout.parts == 1:
            return inputs
        if self.layout.col_parts > 1:
            return self._gather_tiles(inputs)
        group = _group(self)
        axis = self.axis % len(inputs.shape)
        order = [axis] + [i for i in range(len(inputs.shape)) if i != axis]
        inverse = [order.index(i) for i in range(len(order))]
        whole = group.gather(tf.transpose(inputs, order))  # the split axis first
        return tf.transpose(whole, inverse)

    def _gather_tiles(self, inputs):
        """K x L tiles `[b, h, w, c]` -> `[b, K h, L w, c]` (all-gather; backward all-reduce)."""
        if len(inputs.shape) != 4 or self.axis % 4 != 1:
            raise ValueError(
                f"layer '{self.name}' gathers {self.layout.flag} tiles of [b, h, w, c] "
                f"(axis=1), not axis {self.axis} of {inputs.shape}"
            )
        group = _group(self)
        rows, cols = self.layout.row_parts, self.layout.col_parts
        h, w, c = inputs.shape[1:]
        tiles = tf.reshape(group.gather(inputs), [rows, cols, -1, h, w, c])  # row-major members
        return tf.reshape(tf.transpose(tiles, [2, 0, 3, 1, 4, 5]), [-1, rows * h, cols * w, c])

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        if self.layout.col_parts > 1:
            rows, cols = self.layout.row_parts, self.layout.col_parts
            return (shape[0], shape[1] * rows, shape[2] * cols, *shape[3:])
        axis = self.axis % len(shape)
        shape[axis] = None if shape[axis] is None else shape[axis] * self.layout.parts
        return tuple(shape)

    def get_config(self):
        return {**super().get_config(), "axis": self.axis}


@keras.saving.register_keras_serializable(package="mlperf_tf")
class SpatialGlobalAveragePooling2D(_LayoutLayer):
    """The mean over the whole image's rows and columns of tiles `[b, h, w, c]` -> `[b, c]`.

    Forward: one all-reduce over the spatial group of the tile's sums / (H x W). Backward: one
    all-reduce of the gradient (`Collectives.differentiable_all_reduce`).
    """

    def call(self, inputs):
        rows = inputs.shape[1] * self.layout.row_parts
        width = inputs.shape[2] * self.layout.col_parts
        sums = tf.reduce_sum(inputs, axis=[1, 2]) / float(rows * width)  # [b, c]
        if self.layout.parts == 1:
            return sums
        return _group(self).sum(sums, "pool")

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])


class SpatialBuilder:
    """Builds a convolutional trunk (Keras functional) whose activations are tiles while they
    split, and whole (replicated over the group) after: the one place a model chooses between
    the halo layers and Keras' own.

    With `layout.parts == 1` every method makes exactly the plain Keras layers (an int padding
    is `ZeroPadding2D` + a 'valid' op), so the unsplit model is unchanged. With K x L tiles the
    activations start split (`start`); before a group of window ops that cannot run on tiles
    (`keep_split`: a height (width) that does not split into K (L) parts of a multiple of the
    stride, or a halo wider than a tile) the tiles are gathered (`SpatialGather`) and the rest
    of the trunk runs whole on every member of the group. That is exact: batch norm over K L
    identical copies has the statistics of one (`batch_norm_group`), and the gather's backward
    sums the members' gradients. An image that does not split through the stem starts whole
    (`start(images, split=False)`): the first block whose input splits cuts its tiles there
    (`SpatialSlice`; exact too: each member's backward carries its tile's share of the whole
    prefix's gradient, and the sum over replicas adds them up). So the state goes at most once
    from whole to split, then at most once back (`ever_split` says whether it ever was).

    Args:
      layout: the spatial layout (K x L = `layout.parts`); None: that of the run's mesh
        (`mlperf_tf.parallel.current_mesh()`; whole images outside a run).
    """

    def __init__(self, layout: SpatialLayout | None = None):
        self.layout = layout or SpatialLayout(current_mesh() or DeviceMesh())
        self.split = self.layout.parts > 1
        self.pending = False  # whole so far, to be split at the first block that splits
        self.ever_split = self.split

    @property
    def parts(self) -> int:
        return self.layout.parts

    def batch_norm_group(self, group_size: int) -> int:
        """`CrossReplicaBatchNormalization`'s group size for a BN group of `group_size` batch
        shards: the K x L tiles (or copies) of each of them, consecutive replica ids."""
        return group_size * self.parts

    def rows(self, x) -> int:
        """Rows of the whole image's activation `x` (split or not)."""
        return x.shape[1] * (self.layout.row_parts if self.split else 1)

    def cols(self, x) -> int:
        """Columns of the whole image's activation `x` (split or not)."""
        return x.shape[2] * (self.layout.col_parts if self.split else 1)

    def image_splits(self, size: int, windows) -> bool:
        """Whether a whole `size` x `size` image stays in this layout's tiles through `windows`
        ((kernel, stride, padding)); True without a split."""
        return not self.split or spatial_lib.image_splits(size, size, self.layout, windows)

    def start(self, images, *, split: bool = True):
        """The model's whole input images -> this replica's tile (unchanged when K = L = 1).

        Args:
          split: False when the images do not split through the stem: they stay whole, and
            `keep_split` cuts the tiles at the first block whose input splits.
        """
        if self.split and not split:
            self.split, self.pending, self.ever_split = False, True, False
        if not self.split:
            return images
        return SpatialSlice(layout=self.layout, name="spatial_slice")(images)

    def splits(self, x, windows) -> bool:
        """Whether `x` is split and stays split through `windows` ((kernel, stride, padding))."""
        return self.split and spatial_lib.image_splits(
            self.rows(x), self.cols(x), self.layout, windows
        )

    def keep_split(self, x, windows, *, name: str):
        """`x`, gathered whole first when it is split but `windows` cannot run on its tiles; or,
        while the trunk is whole since a stem that did not split, cut into tiles once it can
        run `windows` on them."""
        if self.pending and spatial_lib.image_splits(x.shape[1], x.shape[2], self.layout, windows):
            x = SpatialSlice(layout=self.layout, name=f"{name}_slice")(x)
            self.split, self.pending, self.ever_split = True, False, True
        elif self.split and not self.splits(x, windows):
            x = SpatialGather(1, layout=self.layout, name=f"{name}_gather")(x)
            self.split = False
        return x

    def conv(self, x, filters, kernel, *, stride=1, padding="same", name, split=None, **kwargs):
        """A convolution of `x` (split when `split`, default: the builder's state).

        Args:
          padding: "same", "valid" or an int of zero rows and columns on each side.
          **kwargs: `Conv2D` arguments (use_bias, initializers, ...).
        """
        if self.split if split is None else split:
            return HaloConv2D(
                filters, kernel, strides=stride, padding=padding, layout=self.layout,
                name=name, **kwargs,
            )(x)  # fmt: skip
        if isinstance(padding, int) and not isinstance(padding, bool):
            if padding:
                x = keras.layers.ZeroPadding2D(padding, name=f"{name}_pad")(x)
            padding = "valid"
        return keras.layers.Conv2D(
            filters, kernel, strides=stride, padding=padding, name=name, **kwargs
        )(x)

    def max_pool(self, x, pool_size, *, stride, padding="same", name):
        """Max pooling ("same": Keras' -inf padding; an int: zero padding, as SSD's)."""
        if self.split:
            return HaloMaxPooling2D(
                pool_size, stride, padding=padding, layout=self.layout, name=name
            )(x)
        if isinstance(padding, int) and not isinstance(padding, bool):
            x = keras.layers.ZeroPadding2D(padding, name=f"{name}_pad")(x)
            padding = "valid"
        return keras.layers.MaxPooling2D(pool_size, strides=stride, padding=padding, name=name)(x)

    def global_average_pool(self, x, *, name):
        """`[b, h, w, c]` -> `[b, c]`, the mean over the whole image (whole on every member)."""
        if self.split:
            return SpatialGlobalAveragePooling2D(layout=self.layout, name=name)(x)
        return keras.layers.GlobalAveragePooling2D(name=name)(x)

    def whole(self, x, *, axis=1, name, split=None):
        """`x` whole on every member: gathered along `axis` if it is split (`split`, default:
        the builder's state), else itself."""
        if self.split if split is None else split:
            return SpatialGather(axis, layout=self.layout, name=name)(x)
        return x
