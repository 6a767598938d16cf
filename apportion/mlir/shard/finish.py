"""A device's finish of a mean or argmax whose reduction is split over devices, as MLIR on
tensors (``schedule.mesh.FinishPart`` in numpy): the local mean scaled by the device's share of
the count, or the local max and index packed into int64 argmax keys."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from apportion.ir.program import TensorType
from apportion.mlir.shard.body import Block, convert, generic, tensor_type
from apportion.mlir.types import mlir_type as elt
from apportion.sharding.rules import Finish

#: the largest flat index an argmax key holds (its low 32 bits; ``schedule.mesh.argmax_keys``)
LOW = (1 << 32) - 1


def _ttype(t: TensorType) -> str:
    return tensor_type(t.shape, elt(t.dtype))


def identity_map(rank: int) -> str:
    ds = ", ".join(f"d{i}" for i in range(rank))
    return f"affine_map<({ds}) -> ({ds})>"


def finish_op(b: Block, finish: Finish, types: Mapping[str, TensorType], vals: Mapping[str, str]
            ) -> str:
    """A device's finish of a mean or argmax split over devices: its local mean scaled by its
    share of the count, or its local max and index packed into int64 keys
    (``schedule.mesh.argmax_keys``)."""
    out_t = types[finish.result]
    shape, rank = out_t.shape, len(out_t.shape)
    ident = identity_map(rank)
    src = [types[s] for s in finish.sources]
    ins = [(vals[s], _ttype(t), elt(t.dtype), ident) for s, t in zip(finish.sources, src,
                                                                       strict=True)]
    out_e = elt(out_t.dtype)
    init = b.fresh(f"{finish.result}_init")
    b.emit(f"{init} = tensor.empty() : {tensor_type(shape, out_e)}")
    kind = str(getattr(finish.kind, "value", finish.kind))

    def body(bb: Block, args: list[str], outs: list[str]) -> list[str]:
        if kind == "scale":
            x = convert(bb, args[0], ins[0][2], "f64")
            f = bb.const(finish.factor, "f64")
            y = bb.fresh("scaled")
            bb.emit(f"{y} = arith.mulf {x}, {f} : f64")
            return [convert(bb, y, "f64", out_e)]
        return [pack_key(bb, args[0], ins[0][2], args[1], ins[1][2], finish)]

    return generic(b, [f"p{i}" for i in range(rank)], (), ins,
                   [(init, tensor_type(shape, out_e), out_e, ident)], body,
                   f"{finish.result}_fin")[0]


def pack_key(b: Block, value: str, v_elt: str, index: str, i_elt: str, finish: Finish) -> str:
    """One (value, local flat index) pair as an int64 argmax key: the value's float32 bits
    made monotonic (NaN above all, -0 as +0) in the high 32 bits, ``2**32 - 1`` less the
    global flat index in the low ones."""
    if v_elt in ("f16", "bf16", "f32", "f64"):
        f = convert(b, value, v_elt, "f32")
        zero = b.const(0.0, "f32")
        z = b.fresh("plus0")
        b.emit(f"{z} = arith.addf {f}, {zero} : f32")
        nan = b.fresh("isnan")
        b.emit(f"{nan} = arith.cmpf uno, {f}, {f} : f32")
        qnan = b.fresh("qnan")
        b.emit(f"{qnan} = arith.constant 0x7FC00000 : f32")
        canon = b.fresh("canon")
        b.emit(f"{canon} = arith.select {nan}, {qnan}, {z} : f32")
        bits = b.fresh("bits")
        b.emit(f"{bits} = arith.bitcast {canon} : f32 to i32")
        wide = convert(b, bits, "i32", "i64")
        neg = b.fresh("neg")
        c0 = b.const(0, "i64")
        b.emit(f"{neg} = arith.cmpi slt, {wide}, {c0} : i64")
        mask = b.const(0x7FFFFFFF, "i64")
        flip = b.fresh("flip")
        b.emit(f"{flip} = arith.xori {wide}, {mask} : i64")
        high = b.fresh("high")
        b.emit(f"{high} = arith.select {neg}, {flip}, {wide} : i64")
    else:
        high = convert(b, value, v_elt, "i64")
    idx = convert(b, index, i_elt, "i64")
    # unravel over the device's reduction sizes, shift by its starts, ravel over the whole
    flat = None
    rest = idx
    coords = []
    for n in reversed(finish.local):
        cn = b.const(n, "i64")
        c = b.fresh("coord")
        b.emit(f"{c} = arith.remsi {rest}, {cn} : i64")
        q = b.fresh("rest")
        b.emit(f"{q} = arith.divsi {rest}, {cn} : i64")
        coords.append(c)
        rest = q
    coords.reverse()
    for c, s, n in zip(coords, finish.starts, finish.sizes, strict=True):
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
    low = b.const(LOW, "i64")
    lo = b.fresh("lo")
    b.emit(f"{lo} = arith.subi {low}, {flat} : i64")
    c32 = b.const(32, "i64")
    hs = b.fresh("hi")
    b.emit(f"{hs} = arith.shli {high}, {c32} : i64")
    key = b.fresh("key")
    b.emit(f"{key} = arith.ori {hs}, {lo} : i64")
    return key


def cast_body(unpack: bool, src: str, dst: str
              ) -> Callable[[Block, list[str], list[str]], list[str]]:
    """A generic body converting an element from ``src`` to ``dst``; with ``unpack``, an
    argmax key (``pack_key``) whose reduction is done, turned back into its index."""

    def body(b: Block, args: list[str], outs: list[str]) -> list[str]:
        if unpack:
            low = b.const(LOW, "i64")
            m = b.fresh("low")
            b.emit(f"{m} = arith.andi {args[0]}, {low} : i64")
            i = b.fresh("index")
            b.emit(f"{i} = arith.subi {low}, {m} : i64")
            return [convert(b, i, "i64", dst)]
        return [convert(b, args[0], src, dst)]

    return body
