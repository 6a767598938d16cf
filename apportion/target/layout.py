"""Device layouts ("stickification"): how a tensor's elements lie in device memory.

In the default ``stick`` layout a rank-r tensor ``[d0, ..., d(r-1)]`` is stored with device dims,
outermost first, ``d1 ... d(r-2)``, the sticks of ``d(r-1)``, ``d0``, then the elements of one
stick; the last stick is padded.

>>> from apportion.target import spyre
>>> device_layout((1024, 4096), "float16", spyre()).shape
(64, 1024, 64)
>>> device_layout((128, 256, 512), "float16", spyre()).shape
(256, 8, 128, 64)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apportion.ir.dtypes import dtype_bytes
from apportion.target.target import Target


@dataclass(frozen=True)
class DeviceDim:
    """One device dim: which tensor dim feeds it and whether it counts sticks or elements.

    ``part`` is ``"whole"`` (elements of a tensor dim), ``"sticks"`` (sticks of the innermost
    tensor dim) or ``"in_stick"`` (elements within one stick).
    """

    tensor_dim: int
    part: str
    size: int
    stride: int  # in elements


@dataclass(frozen=True)
class DeviceLayout:
    """The device dims of one tensor, outermost first."""

    dims: tuple[DeviceDim, ...]
    elem_bytes: int
    elems_per_stick: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies, padding included."""
        return math.prod(self.shape) * self.elem_bytes

    def span_bytes(self, extents: tuple[int, ...], offset: int = 0) -> int:
        """Contiguous bytes a core touches when its slice covers ``extents`` per tensor dim.

        Set by the outermost device dim along which the slice has more than one index:
        extent there times that dim's stride. ``offset`` is how far into a stick the slice's
        innermost index may start (``0 <= offset < elems_per_stick``): the slice touches the
        sticks from the one holding its first element to the one holding its last,
        ``floor(offset / eps) .. ceil((offset + extent) / eps)``, one more than its extent
        alone needs where it crosses a stick boundary it would not cross aligned.

        >>> from apportion.target import spyre
        >>> lay = device_layout((4, 256), "float32", spyre())   # 32 elements per stick
        >>> lay.span_bytes((4, 64)), lay.span_bytes((4, 64), offset=18)
        (1024, 1536)
        """
        if not 0 <= offset < self.elems_per_stick:
            raise ValueError(f"stick offset {offset} is outside 0..{self.elems_per_stick - 1}")
        inner = len(extents) - 1
        for d in self.dims:
            e = extents[d.tensor_dim]
            if d.part == "sticks":
                # integer ceil: exact for any size; no more sticks than the tensor has (the
                # offset is the furthest a box may start, not where a box at its end does)
                e = min(-(-(offset + e) // self.elems_per_stick), d.size)
            elif d.part == "in_stick":
                e = min(e, self.elems_per_stick) if d.tensor_dim == inner else e
            if e > 1:
                return e * d.stride * self.elem_bytes
        return self.elem_bytes


def device_layout(shape: tuple[int, ...], dtype: str, target: Target) -> DeviceLayout:
    """The layout of a tensor of ``shape`` and ``dtype`` on ``target``."""
    eps = target.elems_per_stick(dtype)
    r = len(shape)
    if r == 0:
        return DeviceLayout((), dtype_bytes(dtype), eps)
    inner = r - 1
    sticks = -(-shape[inner] // eps)
    if target.layout == "row_major" or r == 1:
        order: list[tuple[int, str, int]] = [(i, "whole", shape[i]) for i in range(r - 1)]
        order += [(inner, "sticks", sticks), (inner, "in_stick", eps)]
    else:
        order = [(i, "whole", shape[i]) for i in range(1, r - 1)]
        order += [(inner, "sticks", sticks), (0, "whole", shape[0]), (inner, "in_stick", eps)]
    dims: list[DeviceDim] = []
    stride = 1
    for tdim, part, size in reversed(order):
        dims.append(DeviceDim(tdim, part, size, stride))
        stride *= size
    return DeviceLayout(tuple(reversed(dims)), dtype_bytes(dtype), eps)
