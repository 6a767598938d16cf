"""How the torch backend holds and reads tensors: contiguous torch tensors of their dtypes, and
strided views of them over boxes.

- Storage: a tensor of dtype ``d`` is held as the contiguous torch tensor of ``TORCH_DTYPES[d]``
  (bfloat16 as torch's bfloat16); a computed value is cast to it as ``kernels.to_storage``
  casts (``cast``: floats to integers saturate, anything to bool is ``!= 0``).
  ``to_torch_storage`` and ``from_torch_storage`` convert to and from the reference executor's
  numpy storage (bfloat16 as float32, exact).
- Views: an operand over a box is a view, never a gather. An access is affine (``q[t,
  128*h+d]``, ``x[2*i, j]``, ``x[o+k, c]``), so its elements over a box are
  ``Tensor.as_strided`` of the stored tensor (``view``: sizes, strides and offset, one stride
  per op dim, 0 for dims the access does not read). A core writes its piece of the output
  through the same kind of view, in place: the cores of an op write disjoint elements. An
  output written through a merge of dims (``y[t, 64*h+d]``) is written through its split view
  (``Op.split_out``: ``y[t, h, d]`` of the output viewed as ``Op.split_shape``, a view of the
  contiguous output, as the reference's ``split_view``).

>>> import numpy as np
>>> t = to_torch_storage(np.arange(6.0).reshape(2, 3), "bfloat16")
>>> t.dtype, from_torch_storage(t).dtype
(torch.bfloat16, dtype('float32'))
>>> from apportion.frontend.json_format import loads
>>> p = loads('{"tensors": {"x": {"shape": [8, 6], "dtype": "float32"}}, "inputs": ["x"], '
...           '"outputs": ["y"], "ops": [{"op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}]}')
>>> view(p.ops[0].ins[0], (8, 6), ("i", "j"), {"i": (2, 4), "j": (0, 6)})
((2, 6), (6, 1), 12)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from apportion.backends.torch.kernels import require_torch, torch
from apportion.errors import ExecutionError
from apportion.ir.kinds import INTEGERS
from apportion.ir.op import Access
from apportion.plans.tiles import Box
from apportion.runtime.torch_xp import saturate

__all__ = ["TORCH_DTYPES", "View", "cast", "from_torch_storage", "is_whole", "shaped", "strided",
           "to_torch_storage", "torch_dtype", "view"]

#: tensor dtype -> torch dtype of the tensor that holds it
TORCH_DTYPES: dict[str, str] = {
    "float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "int8": "int8",
    "int32": "int32", "int64": "int64", "bool": "bool",
}


def torch_dtype(dtype: str) -> Any:
    """The torch dtype that holds a tensor of ``dtype``."""
    try:
        return getattr(torch, TORCH_DTYPES[dtype])
    except KeyError:
        raise ExecutionError(f"no torch dtype for {dtype!r}; valid: "
                             f"{', '.join(TORCH_DTYPES)}") from None


def cast(t: Any, dtype: str) -> Any:
    """A computed tensor as ``dtype``'s storage, as ``kernels.to_storage`` casts: floats to
    ints saturate (``torch_xp.saturate``), anything to bool is ``!= 0``."""
    if dtype == "bool":
        return t if t.dtype == torch.bool else t != 0
    target = torch_dtype(dtype)
    if dtype in INTEGERS and t.is_floating_point():
        return saturate(t, target)
    return t.to(target)


def to_torch_storage(a: Any, dtype: str) -> Any:
    """A numpy array (or tensor) as the contiguous torch tensor that stores ``dtype``."""
    require_torch()
    if not isinstance(a, torch.Tensor):
        a = np.asarray(a)
        # a copy where numpy's strides are not row-major (ascontiguousarray makes 0-d 1-d)
        # torch takes no negative stride, which a C-contiguous array of size-1 axes may have
        plain = a.flags.c_contiguous and min(a.strides, default=0) >= 0
        a = torch.from_numpy(a if plain else a.copy(order="C"))
    return cast(a.detach(), dtype).contiguous()


def from_torch_storage(t: Any) -> np.ndarray:
    """A tensor as the reference executor's storage array (bfloat16 as float32, exact)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


#: a strided view of a stored tensor: sizes, strides, offset in elements from its first element
View = tuple[tuple[int, ...], tuple[int, ...], int]


def _row_major(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return strides[::-1]


def view(acc: Access, shape: Sequence[int], dims: Sequence[str], box: Box,
         squeeze: bool = False) -> View:
    """The elements ``acc`` reads over ``box`` in a contiguous tensor of ``shape``, one axis per
    dim of ``dims`` (in that order; size 1, stride 0 where the access does not read the dim, or
    no axis with ``squeeze``). Affine indices are strides: a sum of dims (``128*h+d``) is a
    stride per dim, a constant an offset, a dim on two axes (a diagonal) the sum of theirs."""
    offset = 0
    coef: dict[str, int] = {}
    for e, s in zip(acc.index, _row_major(shape), strict=True):
        offset += e.const * s
        for d, c in e.terms:
            coef[d] = coef.get(d, 0) + c * s
    size, stride = [], []
    for d in dims:
        if d in coef:
            lo, hi = box[d]
            offset += coef[d] * lo
            size.append(hi - lo)
            stride.append(coef[d])
        elif not squeeze:
            size.append(1)
            stride.append(0)
    return tuple(size), tuple(stride), offset


def strided(t: Any, v: View) -> Any:
    """The view ``v`` of the stored tensor ``t``."""
    return t.as_strided(v[0], v[1], t.storage_offset() + v[2])


def shaped(t: Any, shape: tuple[int, ...]) -> Any:
    """A stored tensor in its own shape: a step's result may be held in the shape it was
    computed in (a lattice's), row-major like the tensor, which every strided view reads
    alike."""
    return t if t.shape == shape else t.view(shape)


def is_whole(v: View, shape: Sequence[int]) -> bool:
    """``v`` is every element of a contiguous tensor of ``shape``, in row-major order."""
    sizes, strides, offset = v
    step = 1
    for n, s in reversed([(n, s) for n, s in zip(sizes, strides, strict=True) if n != 1]):
        if s != step:
            return False
        step *= n
    return offset == 0 and step == math.prod(shape) and math.prod(sizes) == step
