"""Argmax keys in MLIR, written once for every emitter (the mesh modules and the shard forms):
a (value, flat index) pair packed into one int64 key, the format a partial argmax travels in
between devices, and the index taken back out of a reduced key. They follow the numpy of
``schedule.mesh.argmax_keys`` and ``argmax_index`` bit for bit: the high 32 bits order the
values (a float's float32 bits made monotonic, every NaN one NaN above all, -0 as +0; an
integer as it is), the low 32 bits hold ``MAX_KEYED_INDEX`` less the global flat index.

>>> from apportion.mlir.shard.body import Block
>>> b = Block()
>>> key = pack_key(b, "%v", "i32", "%i", "i64", local=(4,), starts=(8,), sizes=(16,))
>>> key, b.lines[-1].strip()
('%key', '%key = arith.ori %hi, %lo : i64')
"""

from __future__ import annotations

from collections.abc import Sequence

from apportion.mlir.types import FLOAT_TYPES, Emits
from apportion.schedule.mesh import MAX_KEYED_INDEX


def _widen(b: Emits, value: str, src: str, dst: str) -> str:
    """``value`` of ``src`` extended to the wider ``dst`` (floats to floats, ints to ints)."""
    if src == dst:
        return value
    name = b.fresh("v")
    op = "extf" if src in FLOAT_TYPES else "extsi"
    b.emit(f"{name} = arith.{op} {value} : {src} to {dst}")
    return name


def pack_key(b: Emits, value: str, v_elt: str, index: str, i_elt: str, local: Sequence[int],
             starts: Sequence[int], sizes: Sequence[int]) -> str:
    """The int64 key of ``value`` (of element type ``v_elt``) at ``index``, its flat index in
    the device's part of the reduction (``local``, the part's sizes; ``starts``, where it
    starts in each reduced dim; ``sizes``, each dim's whole size); the key's SSA name."""
    if v_elt in FLOAT_TYPES:
        f = _widen(b, value, v_elt, "f32")
        zero = b.const(0.0, "f32")
        z = b.fresh("plus0")
        b.emit(f"{z} = arith.addf {f}, {zero} : f32")  # -0 + 0 = +0
        nan = b.fresh("isnan")
        b.emit(f"{nan} = arith.cmpf uno, {f}, {f} : f32")
        qnan = b.fresh("qnan")
        b.emit(f"{qnan} = arith.constant 0x7FC00000 : f32")
        canon = b.fresh("canon")
        b.emit(f"{canon} = arith.select {nan}, {qnan}, {z} : f32")
        bits = b.fresh("bits")
        b.emit(f"{bits} = arith.bitcast {canon} : f32 to i32")
        wide = _widen(b, bits, "i32", "i64")
        neg = b.fresh("neg")
        c0 = b.const(0, "i64")
        b.emit(f"{neg} = arith.cmpi slt, {wide}, {c0} : i64")
        mask = b.const(0x7FFFFFFF, "i64")
        flip = b.fresh("flip")
        b.emit(f"{flip} = arith.xori {wide}, {mask} : i64")
        high = b.fresh("high")
        b.emit(f"{high} = arith.select {neg}, {flip}, {wide} : i64")
    else:
        high = _widen(b, value, v_elt, "i64")
    idx = _widen(b, index, i_elt, "i64")
    # unravel over the device's reduction sizes, shift by its starts, ravel over the whole
    flat = None
    rest = idx
    coords = []
    for n in reversed(local):
        cn = b.const(n, "i64")
        c = b.fresh("coord")
        b.emit(f"{c} = arith.remsi {rest}, {cn} : i64")
        q = b.fresh("rest")
        b.emit(f"{q} = arith.divsi {rest}, {cn} : i64")
        coords.append(c)
        rest = q
    coords.reverse()
    for c, s, n in zip(coords, starts, sizes, strict=True):
        cs = b.const(s, "i64")
        g = b.fresh("g")
        b.emit(f"{g} = arith.addi {c}, {cs} : i64")
        if flat is None:
            flat = g
        else:
            cn = b.const(n, "i64")
            m = b.fresh("scaled")
            b.emit(f"{m} = arith.muli {flat}, {cn} : i64")
            f2 = b.fresh("flat")
            b.emit(f"{f2} = arith.addi {m}, {g} : i64")
            flat = f2
    if flat is None:
        flat = b.const(0, "i64")
    low = b.const(MAX_KEYED_INDEX, "i64")
    lo = b.fresh("lo")
    b.emit(f"{lo} = arith.subi {low}, {flat} : i64")
    c32 = b.const(32, "i64")
    hs = b.fresh("hi")
    b.emit(f"{hs} = arith.shli {high}, {c32} : i64")
    key = b.fresh("key")
    b.emit(f"{key} = arith.ori {hs}, {lo} : i64")
    return key


def unpack_index(b: Emits, key: str) -> str:
    """The flat index in a reduced argmax ``key``, ``MAX_KEYED_INDEX - (key & MAX_KEYED_INDEX)``
    (an i64); its SSA name."""
    low = b.const(MAX_KEYED_INDEX, "i64")
    m = b.fresh("low")
    b.emit(f"{m} = arith.andi {key}, {low} : i64")
    i = b.fresh("index")
    b.emit(f"{i} = arith.subi {low}, {m} : i64")
    return i
