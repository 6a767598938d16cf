"""Where a tensor's elements and tiles lie: device coordinates and per-loop-level tile strides.

Tile addresses follow one convention (fixed by the loop-bundle format): a tensor is addressed
row-major in bytes with its innermost dim padded to whole sticks, and each loop level moves a
tensor's address by the bytes between consecutive tiles along the dims that level tiles.

>>> from apportion.target.presets import spyre
>>> padded_strides((1024, 4096), "float16", spyre())
(8192, 2)
"""

from __future__ import annotations

from apportion.ir.affine import AffineExpr
from apportion.ir.dtypes import dtype_bytes
from apportion.ir.op import Access
from apportion.schedule.values import SymbolicStep
from apportion.target.layout import device_layout
from apportion.target.target import Target


def padded_strides(shape: tuple[int, ...], dtype: str, target: Target) -> tuple[int, ...]:
    """Byte stride of each tensor dim, row-major, the innermost dim padded to whole sticks.

    >>> from apportion.target.presets import spyre
    >>> padded_strides((3, 5, 100), "float16", spyre())   # 100 elements pad to 128
    (1280, 256, 2)
    """
    if not shape:
        return ()
    eps = target.elems_per_stick(dtype)
    padded = [*shape[:-1], -(-shape[-1] // eps) * eps]
    strides = [dtype_bytes(dtype)]
    for n in reversed(padded[1:]):
        strides.append(strides[-1] * n)
    return tuple(reversed(strides))


Stride = int | str


def tile_strides(access: Access, strides: tuple[int, ...],
                 steps: list[dict[str, SymbolicStep]]) -> tuple[Stride, ...]:
    """Bytes the address of ``access``'s tile advances per iteration of each loop level.

    ``strides`` are the tensor's byte strides per dim, ``steps`` per loop level the elements
    one iteration moves along each dim it tiles (``schedule.values.symbolic_steps``); an index
    ``128*h + d`` moves by 128 rows per step of ``h``. A stride that depends on symbolic counts
    is an expression over their names (``"8388608 floordiv T"``; the counts divide exactly).

    >>> tile_strides(Access.parse("a[m,n]"), (8192, 2), [{"m": (512, ())}, {"n": (1024, ())}])
    (4194304, 2048)
    >>> tile_strides(Access.parse("a[m,n]"), (8192, 2), [{"m": (1024, ("T",))}])
    ('8388608 floordiv T',)
    """
    out: list[Stride] = []
    for step in steps:
        terms: dict[tuple[str, ...], int] = {}
        for e, s in zip(access.index, strides, strict=True):
            for d, (n, symbols) in step.items():
                if e.coeff(d):
                    terms[symbols] = terms.get(symbols, 0) + e.coeff(d) * n * s
        if set(terms) <= {()}:
            out.append(terms.get((), 0))
        else:
            out.append(" + ".join(" floordiv ".join([str(k), *syms])
                                  for syms, k in terms.items()))
    return tuple(out)


def affine_text(e: AffineExpr) -> str:
    """``e`` in MLIR affine syntax over the op's dim names.

    >>> affine_text(AffineExpr.parse("128*h+d+4"))
    'h * 128 + d + 4'
    """
    parts = [d if c == 1 else f"{d} * {c}" for d, c in e.terms]
    if e.const or not parts:
        parts.append(str(e.const))
    return " + ".join(parts)


def device_coordinates(access: Access, shape: tuple[int, ...], dtype: str, target: Target
                       ) -> tuple[str, ...]:
    """One affine expression of the op dims per device dim of the tensor (outermost first).

    >>> from apportion.target.presets import spyre
    >>> device_coordinates(Access.parse("a[m,n]"), (1024, 4096), "float16", spyre())
    ('n floordiv 64', 'm', 'n mod 64')
    """
    layout = device_layout(shape, dtype, target)
    out = []
    for dd in layout.dims:
        e = access.index[dd.tensor_dim]
        text = affine_text(e)
        if dd.part != "whole":
            wrapped = f"({text})" if len(e.terms) + bool(e.const) > 1 else text
            op = "floordiv" if dd.part == "sticks" else "mod"
            text = f"{wrapped} {op} {layout.elems_per_stick}"
        out.append(text)
    return tuple(out)


def tile_shape(access: Access, shape: tuple[int, ...], per_iteration: dict[str, int]
               ) -> tuple[int, ...]:
    """The part of a tensor one loop iteration touches: each dim's index extent, capped.

    >>> tile_shape(Access.parse("a[m,n]"), (1024, 4096), {"m": 512, "n": 1024})
    (512, 1024)
    """
    return tuple(min(n, e.extent(per_iteration)) if e.terms else 1
                 for e, n in zip(access.index, shape, strict=True))
