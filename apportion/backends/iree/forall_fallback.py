"""Fallbacks in the parallel IR (``backends.iree.forall``): sort, cumsum and flip run whole along
the last axis of their input, with upstream linalg only: cumsum a running combine over
``j <= i``, flip a gather, sort by rank (each element's rank counts the smaller ones, ties by
position, then each rank picks its element)."""

from __future__ import annotations

from collections.abc import Callable

from apportion.backends.iree.forall_block import _Block
from apportion.backends.iree.forall_body import _apply, _Bodies, _convert
from apportion.backends.iree.forall_index import Ix
from apportion.backends.iree.forall_tensors import TensorVal, _Env, _Slice
from apportion.backends.mlir import symbol_name
from apportion.backends.limits import cite
from apportion.errors import EmitError
from apportion.ir.kinds import MlirBody
from apportion.ir.op import Op


class _Fallbacks(_Bodies):
    """Ops of a fallback kind, built by the construction their body names."""

    def fallback(self, blk: _Block, op: Op, dest: TensorVal, env: _Env) -> TensorVal:
        """A fallback runs whole along the last axis of its whole input; the result is then read
        through the input's access and written through the output's (a transpose at most)."""
        kind = op.kind
        body = kind.mlir_body
        if body is None or body.construction not in _CONSTRUCTIONS:
            raise EmitError(f"op {op.name!r}: kind {kind.name!r} has no MLIR construction; it "
                            f"cannot be emitted as parallel IR {cite('iree-kind-without-mlir')}")
        src = env.vals[op.ins[0].tensor]
        if not src.shape:
            raise EmitError(f"op {op.name!r}: {kind.name} of a rank-0 tensor has no last axis")
        ty = self.compute_type(op)
        res = _CONSTRUCTIONS[body.construction](self, blk, op, body, src, ty)
        dims = list(op.dim_names)
        sizes = self.sizes.of(op)
        box = {d: (Ix(0), n) for d, n in sizes.items()}
        read = self.read(blk, res, op.ins[0], box, dims)
        o = self.extract_out(blk, dest, self.out_region(op, box), op.out.tensor)
        out_results = [f"d{dims.index(d)}" for d in self.out_dims(op)]

        def convert(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            return [_convert(b, args[0], ty, dest.elt)]

        piece = self.generic(blk, dims, sizes, [], [read], [o],
                             out_results, convert, symbol_name(op.out.tensor))[0]
        return self.insert(blk, piece, dest, self.out_region(op, box), parallel=False)

    def along_last(self, src: TensorVal, extra: bool) -> tuple[list[str], list[str], list[str]]:
        """Maps over (..., i[, j]) of ``src``: (x at i, x at j, out at i) results."""
        r = len(src.shape)
        lead = [f"d{k}" for k in range(r - 1)]
        at_i = [*lead, f"d{r - 1}"]
        at_j = [*lead, f"d{r}"] if extra else at_i
        return at_i, at_j, at_i

    def scan(self, blk: _Block, op: Op, body: MlirBody, src: TensorVal, ty: str) -> TensorVal:
        r = len(src.shape)
        at_i, at_j, out = self.along_last(src, True)
        init = self.filled(blk, f"{op.name}_scan", src.shape, ty, body.identity)
        sizes = {f"a{k}": s for k, s in enumerate(src.shape)} | {"j": src.shape[-1]}
        integer = ty == "i64"

        def run(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            x = _convert(b, args[0], src.elt, ty)
            i, j, le = b.fresh("i"), b.fresh("j"), b.fresh("le")
            b.emit(f"{i} = linalg.index {r - 1} : index")
            b.emit(f"{j} = linalg.index {r} : index")
            b.emit(f"{le} = arith.cmpi ule, {j}, {i} : index")
            s = _apply(b, body, integer, ty, {"a": outs[0], "b": x})[0]
            sel = b.fresh("sel")
            b.emit(f"{sel} = arith.select {le}, {s}, {outs[0]} : {ty}")
            return [sel]

        return self.generic(blk, list(sizes), sizes, ["j"],
                            [_Slice(src.ssa, src.type, src.elt, at_j)], [init], out, run,
                            f"{op.name}_scan")[0]

    def reverse(self, blk: _Block, op: Op, body: MlirBody, src: TensorVal, ty: str
                ) -> TensorVal:
        # a gather (tensor.extract at n-1-i): IREE tiles a reversed indexing map wrongly
        r = len(src.shape)
        at_i, _, out = self.along_last(src, False)
        init = self.empty(blk, f"{op.name}_rev", src.shape, ty)
        sizes = {f"a{k}": s for k, s in enumerate(src.shape)}
        last = blk.value(src.shape[-1] - 1)

        def run(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            idx = []
            for k in range(r):
                i = b.fresh(f"i{k}")
                b.emit(f"{i} = linalg.index {k} : index")
                idx.append(i)
            rev = b.fresh("rev")
            b.emit(f"{rev} = arith.subi {last}, {idx[-1]} : index")
            x = b.fresh("x")
            b.emit(f"{x} = tensor.extract {src.ssa}[{', '.join([*idx[:-1], rev])}] : "
                   f"{src.type}")
            return [_convert(b, x, src.elt, ty)]

        return self.generic(blk, list(sizes), sizes, [], [], [init], out, run,
                            f"{op.name}_rev")[0]

    def sort(self, blk: _Block, op: Op, body: MlirBody, src: TensorVal, ty: str) -> TensorVal:
        r = len(src.shape)
        at_i, at_j, out = self.along_last(src, True)
        integer = ty == "i64"
        sizes = {f"a{k}": s for k, s in enumerate(src.shape)} | {"j": src.shape[-1]}
        ranks0 = self.filled(blk, f"{op.name}_rank", src.shape, "i64", 0)

        def rank(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            xi = _convert(b, args[0], src.elt, ty)
            xj = _convert(b, args[1], src.elt, ty)
            lt_ji = _apply(b, body, integer, ty, {"a": xj, "b": xi})[0]
            lt_ij = _apply(b, body, integer, ty, {"a": xi, "b": xj})[0]
            i, j = b.fresh("i"), b.fresh("j")
            b.emit(f"{i} = linalg.index {r - 1} : index")
            b.emit(f"{j} = linalg.index {r} : index")
            names = {k: b.fresh(k) for k in ("first", "true", "nlt", "tie", "before", "one",
                                             "inc", "rank")}
            b.emit(f"{names['first']} = arith.cmpi ult, {j}, {i} : index")
            b.emit(f"{names['true']} = arith.constant true")
            b.emit(f"{names['nlt']} = arith.xori {lt_ij}, {names['true']} : i1")
            b.emit(f"{names['tie']} = arith.andi {names['nlt']}, {names['first']} : i1")
            b.emit(f"{names['before']} = arith.ori {lt_ji}, {names['tie']} : i1")
            b.emit(f"{names['one']} = arith.constant 1 : i64")
            b.emit(f"{names['inc']} = arith.addi {outs[0]}, {names['one']} : i64")
            b.emit(f"{names['rank']} = arith.select {names['before']}, {names['inc']}, "
                   f"{outs[0]} : i64")
            return [names["rank"]]

        ranks = self.generic(blk, list(sizes), sizes, ["j"],
                             [_Slice(src.ssa, src.type, src.elt, at_i),
                              _Slice(src.ssa, src.type, src.elt, at_j)],
                             [ranks0], out, rank, f"{op.name}_rank")[0]
        init = self.filled(blk, f"{op.name}_sorted", src.shape, ty, 0)

        def pick(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            x = _convert(b, args[0], src.elt, ty)
            i, ic, hit, sel = b.fresh("pos"), b.fresh("pos64"), b.fresh("hit"), b.fresh("pick")
            b.emit(f"{i} = linalg.index {r - 1} : index")
            b.emit(f"{ic} = arith.index_cast {i} : index to i64")
            b.emit(f"{hit} = arith.cmpi eq, {args[1]}, {ic} : i64")
            b.emit(f"{sel} = arith.select {hit}, {x}, {outs[0]} : {ty}")
            return [sel]

        return self.generic(blk, list(sizes), sizes, ["j"],
                            [_Slice(src.ssa, src.type, src.elt, at_j),
                             _Slice(ranks.ssa, ranks.type, "i64", at_j)],
                            [init], out, pick, f"{op.name}_sorted")[0]


_CONSTRUCTIONS: dict[str, Callable[..., TensorVal]] = {
    "scan": _Fallbacks.scan,
    "reverse": _Fallbacks.reverse,
    "sort": _Fallbacks.sort,
}
