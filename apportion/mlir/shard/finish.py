"""A device's finish of a mean or argmax whose reduction is split over devices, as MLIR on
tensors (``schedule.mesh.FinishPart`` in numpy): the local mean scaled by the device's share of
the count, or the local max and index packed into int64 argmax keys."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from apportion.ir.program import TensorType
from apportion.mlir.keys import pack_key, unpack_index
from apportion.mlir.shard.body import (
    Block,
    convert,
    generic,
    identity_map,
    tensor_type,
    value_type,
)
from apportion.mlir.types import mlir_type as elt
from apportion.schedule.mesh import FinishPart


def finish_op(b: Block, finish: FinishPart, types: Mapping[str, TensorType],
              vals: Mapping[str, str]) -> str:
    """A device's finish of a mean or argmax split over devices: its local mean scaled by its
    share of the count, or its local max and index packed into int64 keys
    (``mlir.keys.pack_key``)."""
    out_t = types[finish.result]
    shape, rank = out_t.shape, len(out_t.shape)
    ident = identity_map(rank)
    src = [types[s] for s in finish.sources]
    ins = [(vals[s], value_type(t), elt(t.dtype), ident) for s, t in zip(finish.sources, src,
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
        return [pack_key(bb, args[0], ins[0][2], args[1], ins[1][2], finish.local,
                         finish.starts, finish.sizes)]

    return generic(b, [f"p{i}" for i in range(rank)], (), ins,
                   [(init, tensor_type(shape, out_e), out_e, ident)], body,
                   f"{finish.result}_fin")[0]


def cast_body(unpack: bool, src: str, dst: str
              ) -> Callable[[Block, list[str], list[str]], list[str]]:
    """A generic body converting an element from ``src`` to ``dst``; with ``unpack``, an
    argmax key (``mlir.keys``) whose reduction is done, turned back into its index."""

    def body(b: Block, args: list[str], outs: list[str]) -> list[str]:
        if unpack:
            return [convert(b, unpack_index(b, args[0]), "i64", dst)]
        return [convert(b, args[0], src, dst)]

    return body
