"""Provides the layers of spatial partitioning: each replica of a spatial group holds a slab of rows.

The layout (`mlperf_tf.parallel.spatial.SpatialLayout`): the K replicas of one spatial group
read the same images; replica `k` of the group holds rows `[k*H/K, (k+1)*H/K)` of every split
activation `[batch, H/K, W, C]`. Weights are replicated. Each layer states the collectives it
issues, all over the replica's spatial group (`DeviceMesh.group(replica, "spatial")`), in replica
context, on `mlperf_tf.collectives.ops.Collectives`:

| layer | forward | backward |
|---|---|---|
| `SpatialSlice` | none (cuts the slab out of the whole image) | none |
| `HaloConv2D`, `HaloMaxPooling2D` | one all-to-all: halo rows to the neighbours above and below | one all-to-all: the halo rows' gradients back to their owners |
| `SpatialGather` | all-gather of the slabs (the whole tensor on every member) | all-reduce of the gradient, then this slab's rows |
| `SpatialGlobalAveragePooling2D` | all-reduce of the slab's sums | all-reduce of the gradient |

Batch norm over slabs needs no layer of its own: `CrossReplicaBatchNormalization` with
`group_size = bn_group_size x K` sums its statistics over the slabs and over the batch-norm
group of batch shards (consecutive replica ids; `SpatialModel.batch_norm_group`).

Gradients. Every replica's loss is 1/K of its images' loss, and each backward collective is the
adjoint of its forward one, so backpropagation computes, on each replica, the gradient of the
sum of all replicas' losses with respect to that replica's copy of every weight: the partial
gradient from its slab. Keras' `apply_gradients` sums over all replicas (spatial and data
axes), which is then the gradient of the global loss (`mlperf_tf/parallel/README.md`).

The layers need replica ids known at trace time (MirroredStrategy, MultiWorkerMirroredStrategy,
inside a `tf.function`); on TPUs the same layout is `experimental_split_to_logical_devices`.
"""

from __future__ import annotations

import itertools
import weakref

import keras
import tensorflow as tf

from mlperf_tf.collectives import ops as collective_ops
from mlperf_tf.parallel import spatial as spatial_lib
from mlperf_tf.parallel.mesh import DeviceMesh
from mlperf_tf.parallel.spatial import SpatialLayout


class _Group:
    """This replica's place in its spatial group, for one call of a layer (replica context)."""

    def __init__(self, layer: keras.layers.Layer, layout: SpatialLayout):
        ctx = tf.distribute.get_replica_context() if tf.distribute.has_strategy() else None
        if ctx is None:
            raise ValueError(
                f"layer '{layer.name}' holds a slab of a spatially partitioned tensor: call it "
                "in the replica context of the run's strategy"
            )
        replica = collective_ops.static_replica_id(ctx)
        if replica is None or tf.executing_eagerly():
            raise ValueError(
                f"layer '{layer.name}' needs replica ids known at trace time inside a "
                "tf.function (MirroredStrategy); on TPUs spatial partitioning is "
                "experimental_split_to_logical_devices"
            )
        if ctx.num_replicas_in_sync != layout.mesh.size:
            raise ValueError(
                f"layer '{layer.name}' was built for {layout.mesh} ({layout.mesh.size} replicas) "
                f"but runs on {ctx.num_replicas_in_sync}"
            )
        self.members = layout.members(replica)
        self.rank = self.members.index(replica)
        self.parts = len(self.members)
        self.collectives = collective_ops.Collectives(
            replica=replica,
            num_replicas=ctx.num_replicas_in_sync,
            timeout_s=0.0,
            traffic=collective_ops.Traffic(),
        )
        graph = tf.compat.v1.get_default_graph()
        per_replica = layer._spatial_calls.setdefault(graph, {})
        call = per_replica.get(replica, 0)
        per_replica[replica] = call + 1
        # Instance names: equal on every member (each counts its own calls of the layer).
        self.name = f"spatial/{layer.name}/call{call}"


def exchange_halo(x, group: _Group, *, top: int, bottom: int, edge_value: float = 0.0):
    """The `top` rows above and `bottom` rows below this replica's slab `x` ([b, h, w, c]).

    One all-to-all forward (this slab's first `bottom` rows to the member above, its last `top`
    rows to the member below), one backward (the gradients of the received rows back to their
    owners, added to their slabs' rows). At the image's top and bottom the rows are
    `edge_value` (the op's padding: 0, or -inf for max pooling).

    Returns:
      (above [b, top, w, c], below [b, bottom, w, c]).
    """
    n, rank, h = group.parts, group.rank, x.shape[1]
    if max(top, bottom) > h:
        raise ValueError(f"halo rows {top}/{bottom} exceed the slab's {h} rows")
    rows = max(top, bottom)
    backward_calls = itertools.count()

    def edge(count, like):
        shape = tf.concat([tf.shape(like)[:1], [count], tf.shape(like)[2:]], 0)
        return tf.fill(shape, tf.constant(edge_value, like.dtype))

    def to_neighbours(for_above, for_below, like):
        """[n, b, rows, w, c]: row rank-1 carries `for_above`, row rank+1 `for_below`."""
        zeros = tf.zeros_like(like[:, :0])  # [b, 0, w, c]

        def padded(t):
            return tf.concat([t, tf.zeros_like(like[:, : rows - t.shape[1]])], 1)

        chunks = [padded(zeros)] * n
        if rank > 0:
            chunks[rank - 1] = padded(for_above)
        if rank < n - 1:
            chunks[rank + 1] = padded(for_below)
        return tf.stack(chunks)

    @tf.custom_gradient
    def exchanged(slab):
        received = group.collectives.all_to_all(
            to_neighbours(slab[:, :bottom], slab[:, h - top :], slab),
            group.members,
            f"{group.name}/halo",
        )  # row i came from rank i
        above = received[rank - 1][:, :top] if rank > 0 else edge(top, slab)
        below = received[rank + 1][:, :bottom] if rank < n - 1 else edge(bottom, slab)

        def grad(d_above, d_below):
            # d_above belongs to the last `top` rows of the member above; d_below to the first
            # `bottom` rows of the member below.
            returned = group.collectives.all_to_all(
                to_neighbours(d_above, d_below, slab),
                group.members,
                f"{group.name}/halo_grad{next(backward_calls)}",
            )
            d_slab = tf.zeros_like(slab)
            if rank > 0:  # the member above sent the gradient of my first `bottom` rows
                first = returned[rank - 1][:, :bottom]
                d_slab += tf.concat([first, tf.zeros_like(slab[:, bottom:])], 1)
            if rank < n - 1:  # the member below: of my last `top` rows
                last = returned[rank + 1][:, :top]
                d_slab += tf.concat([tf.zeros_like(slab[:, : h - top]), last], 1)
            return d_slab

        return (above, below), grad

    return exchanged(x)


def _check_padding(padding, layer: str):
    if padding not in ("same", "valid") and not (
        isinstance(padding, int) and not isinstance(padding, bool) and padding >= 0
    ):
        raise ValueError(
            f"`padding` ({padding!r}) of layer '{layer}' must be 'same', 'valid' or rows >= 0"
        )


class _SlabWindow:
    """Shared by the halo layers: the whole-image padding of a window op, applied to a slab."""

    def _halo_input(self, x, *, kernel, stride, dilation, edge_value):
        """`x` ([b, h, w, c], a slab; or the whole image when K = 1) with its halo rows and its
        width padding: what a 'valid' window op turns into this slab's rows of the whole op."""
        parts = self.layout.parts
        height, width = x.shape[1] * parts, x.shape[2]
        pad_top, pad_bottom = spatial_lib.window_pads(
            height, kernel=kernel[0], stride=stride[0], dilation=dilation[0], padding=self.pad
        )
        left, right = spatial_lib.window_pads(
            width, kernel=kernel[1], stride=stride[1], dilation=dilation[1], padding=self.pad
        )
        if parts == 1:
            above, below = pad_top, pad_bottom
            x = tf.pad(x, [[0, 0], [above, below], [0, 0], [0, 0]], constant_values=edge_value)
        else:
            halo = spatial_lib.halo(
                height=height, parts=parts, kernel=kernel[0], stride=stride[0],
                dilation=dilation[0], pad_top=pad_top, pad_bottom=pad_bottom,
            )  # fmt: skip
            if halo.top or halo.bottom:
                group = _Group(self, self.layout)
                above, below = exchange_halo(
                    x, group, top=halo.top, bottom=halo.bottom, edge_value=edge_value
                )
                x = tf.concat([above, x, below], axis=1)
        return tf.pad(x, [[0, 0], [0, 0], [left, right], [0, 0]], constant_values=edge_value)

    def _slab_output_shape(self, input_shape, *, kernel, stride, dilation, channels):
        batch, rows, width = input_shape[0], input_shape[1], input_shape[2]
        parts = self.layout.parts
        pads = spatial_lib.window_pads(
            rows * parts, kernel=kernel[0], stride=stride[0], dilation=dilation[0], padding=self.pad
        )
        out_rows = (rows * parts + sum(pads) - (kernel[0] - 1) * dilation[0] - 1) // stride[0] + 1
        left, right = spatial_lib.window_pads(
            width, kernel=kernel[1], stride=stride[1], dilation=dilation[1], padding=self.pad
        )
        out_width = (width + left + right - (kernel[1] - 1) * dilation[1] - 1) // stride[1] + 1
        return (batch, out_rows // parts, out_width, channels)


@keras.saving.register_keras_serializable(package="mlperf_tf")
class HaloConv2D(_SlabWindow, keras.layers.Conv2D):
    """`keras.layers.Conv2D` on a slab of rows: the rows of the whole image's convolution.

    Forward: one all-to-all over the spatial group (halo rows from the neighbours; none when the
    window needs no halo, e.g. 1x1), then a 'valid' convolution of the slab with its halo and
    its width padding. Backward: one all-to-all (the halo rows' gradients back to their owners).
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
        # Per traced graph, per replica: calls so far (weak keys: gone with the graph).
        self._spatial_calls = weakref.WeakKeyDictionary()

    def call(self, inputs):
        x = self._halo_input(
            inputs,
            kernel=self.kernel_size,
            stride=self.strides,
            dilation=self.dilation_rate,
            edge_value=0.0,
        )
        return super().call(x)

    def compute_output_shape(self, input_shape):
        return self._slab_output_shape(
            input_shape,
            kernel=self.kernel_size,
            stride=self.strides,
            dilation=self.dilation_rate,
            channels=self.filters,
        )

    def get_config(self):
        return {**super().get_config(), "padding": self.pad, "layout": self.layout.get_config()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layout"] = SpatialLayout.from_config(config["layout"])
        return cls(**config)


@keras.saving.register_keras_serializable(package="mlperf_tf")
class HaloMaxPooling2D(_SlabWindow, keras.layers.MaxPooling2D):
    """`keras.layers.MaxPooling2D` on a slab of rows, with halo rows from the neighbours.

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
        # Per traced graph, per replica: calls so far (weak keys: gone with the graph).
        self._spatial_calls = weakref.WeakKeyDictionary()

    def call(self, inputs):
        edge = 0.0 if isinstance(self.pad, int) else float(inputs.dtype.min)
        x = self._halo_input(
            inputs, kernel=self.pool_size, stride=self.strides, dilation=(1, 1), edge_value=edge
        )
        return super().call(x)

    def compute_output_shape(self, input_shape):
        return self._slab_output_shape(
            input_shape,
            kernel=self.pool_size,
            stride=self.strides,
            dilation=(1, 1),
            channels=input_shape[-1],
        )

    def get_config(self):
        return {**super().get_config(), "padding": self.pad, "layout": self.layout.get_config()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layout"] = SpatialLayout.from_config(config["layout"])
        return cls(**config)


class _LayoutLayer(keras.layers.Layer):
    def __init__(self, *, layout: SpatialLayout, **kwargs):
        super().__init__(**kwargs)
        self.layout = layout
        self._spatial_calls = weakref.WeakKeyDictionary()  # as HaloConv2D's

    def get_config(self):
        return {**super().get_config(), "layout": self.layout.get_config()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layout"] = SpatialLayout.from_config(config["layout"])
        return cls(**config)


@keras.saving.register_keras_serializable(package="mlperf_tf")
class SpatialSlice(_LayoutLayer):
    """The whole image `[b, H, W, c]` -> this replica's slab `[b, H/K, W, c]`. No collective:
    every replica of the group has the whole batch (the runner routes it), so each holds
    the group's input K times over (3 channels: small beside the activations it splits)."""

    def call(self, inputs):
        if self.layout.parts == 1:
            return inputs
        group = _Group(self, self.layout)
        rows = inputs.shape[1] // group.parts
        return inputs[:, group.rank * rows : (group.rank + 1) * rows]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[1] // self.layout.parts, *input_shape[2:])


@keras.saving.register_keras_serializable(package="mlperf_tf")
class SpatialGather(_LayoutLayer):
    """The slabs of the group concatenated along `axis`: the whole tensor on every member.

    Forward: one all-gather over the spatial group. Backward: one all-reduce of the gradient
    over the group, then this replica's slice (the adjoint: every member's copy of the whole
    tensor fed its loss share). Use it where the slabs end: an activation too small to split,
    or the SSD heads' per-level outputs (`axis=1`: anchors are position-major, so a slab's
    anchors are a contiguous block).

    Args:
      axis: the split axis (1: rows of `[b, h, w, c]`, or anchors of `[b, anchors, k]`).
      layout: (keyword-only) the spatial layout.
    """

    def __init__(self, axis: int = 1, *, layout: SpatialLayout, **kwargs):
        super().__init__(layout=layout, **kwargs)
        self.axis = axis

    def call(self, inputs):
        if self.layout.parts == 1:
            return inputs
        group = _Group(self, self.layout)
        axis = self.axis % len(inputs.shape)
        n, rank, size = group.parts, group.rank, inputs.shape[axis]
        order = [axis] + [i for i in range(len(inputs.shape)) if i != axis]
        inverse = [order.index(i) for i in range(len(order))]
        backward_calls = itertools.count()

        @tf.custom_gradient
        def gathered(x):
            front = tf.transpose(x, order)  # the split axis first
            flat = group.collectives.all_gather(
                tf.reshape(front, [-1]), group.members, f"{group.name}/gather"
            )
            whole = tf.reshape(flat, [n * size, *front.shape[1:]])

            def grad(upstream):
                summed = group.collectives.all_reduce(
                    tf.transpose(upstream, order),
                    group.members,
                    f"{group.name}/gather_grad{next(backward_calls)}",
                )
                return tf.transpose(summed[rank * size : (rank + 1) * size], inverse)

            return tf.transpose(whole, inverse), grad

        return gathered(inputs)

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        axis = self.axis % len(shape)
        shape[axis] = None if shape[axis] is None else shape[axis] * self.layout.parts
        return tuple(shape)

    def get_config(self):
        return {**super().get_config(), "axis": self.axis}


@keras.saving.register_keras_serializable(package="mlperf_tf")
class SpatialGlobalAveragePooling2D(_LayoutLayer):
    """The mean over the whole image's rows and columns of slabs `[b, h, w, c]` -> `[b, c]`.

    Forward: one all-reduce over the spatial group of the slab's sums / (H x W). Backward: one
    all-reduce of the gradient (`Collectives.differentiable_all_reduce`).
    """

    def call(self, inputs):
        rows, width = inputs.shape[1] * self.layout.parts, inputs.shape[2]
        sums = tf.reduce_sum(inputs, axis=[1, 2]) / float(rows * width)  # [b, c]
        if self.layout.parts == 1:
            return sums
        group = _Group(self, self.layout)
        return group.collectives.differentiable_all_reduce(
            sums, group.members, f"{group.name}/pool"
        )

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])


class SpatialBuilder:
    """Builds a convolutional trunk (Keras functional) whose activations are slabs while they
    split, and whole (replicated over the group) after: the one place a model chooses between
    the halo layers and Keras' own.

    With `layout.parts == 1` every method makes exactly the plain Keras layers (an int padding
    is `ZeroPadding2D` + a 'valid' op), so the unsplit model is unchanged. With K slabs the
    activations start split (`start`); before a group of window ops that cannot run on slabs
    (`keep_split`: a height that does not split into K slabs of a multiple of the stride, or a
    halo wider than a slab) the slabs are gathered (`SpatialGather`) and the rest of the trunk
    runs whole on every member of the group. That is exact: batch norm over K identical copies
    has the statistics of one (`batch_norm_group`), and the gather's backward sums the members'
    gradients. The state only goes from split to whole.

    Args:
      layout: the spatial layout (K = `layout.parts`).
    """

    def __init__(self, layout: SpatialLayout | None):
        self.layout = layout or SpatialLayout(DeviceMesh())
        self.split = self.layout.parts > 1

    @property
    def parts(self) -> int:
        return self.layout.parts

    def batch_norm_group(self, group_size: int) -> int:
        """`CrossReplicaBatchNormalization`'s group size for a BN group of `group_size` batch
        shards: the K slabs (or K copies) of each of them, consecutive replica ids."""
        return group_size * self.parts

    def rows(self, x) -> int:
        """Rows of the whole image's activation `x` (split or not)."""
        return x.shape[1] * (self.parts if self.split else 1)

    def start(self, images):
        """The model's whole input images -> this replica's slab (unchanged when K = 1)."""
        if not self.split:
            return images
        return SpatialSlice(layout=self.layout, name="spatial_slice")(images)

    def splits(self, x, windows) -> bool:
        """Whether `x` is split and stays split through `windows` ((kernel, stride, padding))."""
        return self.split and spatial_lib.splits(self.rows(x), self.parts, windows)

    def keep_split(self, x, windows, *, name: str):
        """`x`, gathered whole first when it is split but `windows` cannot run on its slabs."""
        if self.split and not self.splits(x, windows):
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
