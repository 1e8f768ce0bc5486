"""Provides `SpatialLayout`: images split into tiles (K slabs of rows x L of columns) over the mesh's `spatial` axis.

Spatial partitioning (Kumar et al. 2019, "Scale MLPerf-0.6 models on Google TPU-v3 Pods";
TF1's `input_partition_dims`) is a layout over the device mesh: the replicas of one spatial
group (`DeviceMesh.group(replica, "spatial")`, K x L replicas) read the same batch, and the
member at position `t` of the group (row-major: tile row `i = t // L`, tile column `j = t % L`)
holds rows `[i * H/K, (i+1) * H/K)` and columns `[j * W/L, (j+1) * W/L)` of every activation,
replicated along the other axes (`--spatial_partition=K` is L = 1: slabs of rows; `KxL` is
TF1's `input_partition_dims=[1, K, L, 1]`). The layers that keep this layout (halo-exchange
convolution and pooling, gather, global pooling) are in `mlperf_tf/layers/spatial.py`; this
module holds the arithmetic they share: where a replica sits in its group, and how many halo
rows (or columns: the same arithmetic along the width) a window needs from each neighbour.
"""

from __future__ import annotations

import dataclasses
import math

from mlperf_tf.parallel.mesh import DeviceMesh


@dataclasses.dataclass(frozen=True)
class SpatialLayout:
    """How a model's activations are split over the spatial axis of `mesh`.

    Attributes:
      mesh: the run's device mesh; `mesh.spatial` is K, the slabs per image.
    """

    mesh: DeviceMesh

    @property
    def parts(self) -> int:
        """K x L: tiles per image (1: the layout is the whole image, no collective)."""
        return self.mesh.spatial

    @property
    def row_parts(self) -> int:
        """K: tiles along the height."""
        return self.mesh.spatial_rows

    @property
    def col_parts(self) -> int:
        """L: tiles along the width (1: slabs of rows)."""
        return self.mesh.spatial_cols

    @property
    def flag(self) -> str:
        """The `--spatial_partition` value of this layout: "K" or "KxL"."""
        if self.col_parts == 1:
            return str(self.parts)
        return f"{self.row_parts}x{self.col_parts}"

    @property
    def pieces(self) -> str:
        """What an image is split into, for messages: "K slabs" or "KxL tiles"."""
        return f"{self.parts} slabs" if self.col_parts == 1 else f"{self.flag} tiles"

    def members(self, replica: int) -> list[int]:
        """The replicas holding the tiles of `replica`'s images, row-major (top-left first)."""
        return self.mesh.group(replica, "spatial")

    def index(self, replica: int) -> int:
        """Which tile `replica` holds, row-major (0 = top left)."""
        return self.mesh.index(replica, "spatial")

    def tile(self, replica: int) -> tuple[int, int]:
        """(tile row i < K, tile column j < L) of `replica`."""
        return divmod(self.index(replica), self.col_parts)

    def column_members(self, replica: int) -> list[int]:
        """The K members in `replica`'s tile column, top first: its neighbours above/below."""
        return self.members(replica)[self.tile(replica)[1] :: self.col_parts]

    def row_members(self, replica: int) -> list[int]:
        """The L members in `replica`'s tile row, left first: its neighbours left/right."""
        i = self.tile(replica)[0]
        return self.members(replica)[i * self.col_parts : (i + 1) * self.col_parts]

    def get_config(self) -> dict:
        return dataclasses.asdict(self.mesh)

    @classmethod
    def from_config(cls, config: dict) -> SpatialLayout:
        return cls(DeviceMesh(**config))


def stem_refusal(layout: SpatialLayout, *, size: int, setting: str) -> str:
    """The one-line reason a model of `size` x `size` images never splits into `layout`'s
    tiles: its ResNet stem (7x7/2 convolution, 3x3/2 max pool) splits when each of K and L
    divides `size / 4`; a stem that does not runs whole, and no later block split either.

    Why uneven tiles are not built: the whole model's rows at every layer must be
    reproduced exactly. Padding the image to a multiple of 4K (e.g. SSD300's 300 px to 304)
    and cropping the heads keeps the feature-map sizes but not the values: the padded rows
    past the image's edge become non-zero after the first convolution (bias, batch norm's
    shift), so every layer would have to re-zero them (they are the next layer's zero padding)
    and batch norm would have to take its statistics over the valid rows only (a masked
    count on each tile, all-reduced); tiles of unequal sizes instead give the collectives
    unequal shapes per member and move the stride phase between tiles. Neither is built.

    Args:
      size: the image side in pixels.
      setting: the config setting naming it (`data.image_size`, `model.image_size`).
    """
    multiple = 4 * max(layout.row_parts, layout.col_parts)
    hint = f"the side must be a multiple of {multiple}"
    if size % 4 == 0:
        quarter = size // 4
        divisors = [str(k) for k in range(2, min(quarter, 16) + 1) if quarter % k == 0][:3]
        examples = f" (e.g. {', '.join(divisors)})" if divisors else ""
        hint = f"K and L must divide {quarter}, the side / 4{examples}, or {hint}"
    return (
        f"--spatial_partition={layout.flag}: at an image side of {size} (`{setting}`) no layer "
        f"splits into {layout.pieces}: for the stem (7x7/2 convolution, 3x3/2 max pool) "
        f"{hint}; uneven tiles are not built (exactness would need batch norm over the valid "
        "rows only and the padding rows re-zeroed after every layer)"
    )


def same_padding(size: int, *, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TF's `SAME` padding (before, after) of a window along one axis of `size` elements."""
    effective = (kernel - 1) * dilation + 1
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


@dataclasses.dataclass(frozen=True)
class Halo:
    """The rows a windowed op on a slab needs beyond it.

    Attributes:
      top: rows from the slab above (the image's top padding for the first slab).
      bottom: rows from the slab below (bottom padding for the last slab); 0 when the window's
        last row never passes the slab's end (a 1x1 window at stride 2: a 'valid' op on the
        slab then reads exactly its rows). `bottom` can be smaller than the image's bottom
        padding: rows of padding no output reads are not made.
    """

    top: int
    bottom: int


def halo(
    *, height: int, parts: int, kernel: int, stride: int, dilation: int, pad_top: int, pad_bottom: int
) -> Halo:  # fmt: skip
    """The halo of a window op on slabs, or a `ValueError` saying why the slabs cannot run it.

    The whole-image op reads, for output row `i`, input rows `i*stride - pad_top + j*dilation`
    (j < kernel). Slab `k` of `height / parts` rows computes the output rows
    `[k * out/parts, (k+1) * out/parts)`, which is the whole op's output split into equal slabs
    when the slab height is a multiple of the stride: it then needs `pad_top` rows above and
    `(kernel-1)*dilation + 1 - stride - pad_top` below (none if that is negative).

    Args:
      height: rows of the whole image's input.
      parts: slabs (K).
      kernel, stride, dilation: of the window along the height.
      pad_top, pad_bottom: the whole op's zero (or -inf) padding rows above and below.

    Raises:
      ValueError: the rows do not split into `parts` slabs of a multiple of `stride` rows, the
        output does not split evenly, or a halo is wider than a slab (it would need rows from
        beyond the nearest neighbour).
    """
    effective = (kernel - 1) * dilation + 1
    out = (height + pad_top + pad_bottom - effective) // stride + 1
    slab = height // parts
    if height % parts or slab % stride or out != height // stride:
        raise ValueError(
            f"{height} rows do not split into {parts} slabs of a multiple of the stride "
            f"{stride} with an equal share of the {out} output rows"
        )
    bottom = max(effective - stride - pad_top, 0)
    if max(pad_top, bottom) > slab or bottom > pad_bottom:
        raise ValueError(
            f"a window of {kernel} (dilation {dilation}, padding {pad_top}/{pad_bottom}) needs "
            f"{pad_top}/{bottom} halo rows, more than a slab of {slab} rows can give"
        )
    return Halo(top=pad_top, bottom=bottom)


def window_pads(
    size: int, *, kernel: int, stride: int, dilation: int = 1, padding
) -> tuple[int, int]:
    """(before, after) padding of a window op along an axis of `size`: `padding` is "same"
    (TF's), "valid" or an int (PyTorch's symmetric padding)."""
    if padding == "same":
        return same_padding(size, kernel=kernel, stride=stride, dilation=dilation)
    if padding == "valid":
        return 0, 0
    return int(padding), int(padding)


def image_splits(height: int, width: int, layout: SpatialLayout, windows) -> bool:
    """Whether a `height` x `width` activation stays in `layout`'s K x L tiles through
    `windows` (the same arithmetic along each axis: `splits`)."""
    return splits(height, layout.row_parts, windows) and splits(width, layout.col_parts, windows)


def splits(height: int, parts: int, windows) -> bool:
    """Whether an activation of `height` rows can stay in `parts` slabs through `windows`.

    Args:
      windows: (kernel, stride, padding) of the window ops that read it, padding as in
        `window_pads`.
    """
    if parts == 1:
        return True
    try:
        for kernel, stride, padding in windows:
            top, bottom = window_pads(height, kernel=kernel, stride=stride, padding=padding)
            halo(
                height=height, parts=parts, kernel=kernel, stride=stride, dilation=1,
                pad_top=top, pad_bottom=bottom,
            )  # fmt: skip
    except ValueError:
        return False
    return True
