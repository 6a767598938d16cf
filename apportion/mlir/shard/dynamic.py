"""The dynamic-list form (form 5): a sharded program over a mesh whose axis sizes are known only
at run time (``tp=N~4``: ``shard.grid @mesh(shape = ?)``), one compiled text for every device
count.

* One per-shard function per op, ``@"PROG.shard.OP"``: the op on one device's part of its
  iteration space as ``linalg.generic`` on tensors whose split dims are dynamic (``?``): it
  takes each split op dim's run-time size (``index``) and the device's slices of the operands
  and returns its shard of the output (a partial value in its partial dtype; a mean split over
  devices already scaled by the whole count, an argmax split over devices as packed int64
  (value, global index) keys). An op the plan does not split is ``body.render_op`` on whole
  tensors.
* The list function ``@"PROG.list"(counts..., inputs...)``: every value between ops is held
  whole, the list of its shards at their boxes. For each op it loops (``scf.for``) over the
  mesh axes the op's strategy splits, run-time counts included; at each coordinate it computes
  the device's offset and size of each split dim at run time by apportion's own cut
  (``spec.chunk``: ``floor`` or ``ceil(n / k)`` elements, the larger first, outer axis first),
  cuts the operands the device reads (``tensor.extract_slice`` with dynamic offsets and sizes:
  its shard, or the window or range a shifted read reaches), calls the per-shard function and
  puts the result back: a shard is inserted into the whole (a gather is that insert), a
  partial shard is combined into the whole by its reducer (``sum``, ``max``, ``min``, ``prod``,
  ``any``, an argmax's keys by ``max``) and the total cast to the tensor's dtype (an argmax's
  keys unpacked to the index) once every device's part is in. So every resharding the plan
  makes between ops (all-gather, slice, all-to-all, a halo or a read of peers' memory in place)
  is an insert into the whole and the reader's cut from it, all expressible over a run-time
  list. Devices along an axis the op's strategy does not name hold replicas of its result:
  one replica is computed.
* The wrapper ``@"PROG"`` keeps the caller's signature: it reads each symbolic axis's size from
  the grid (``shard.grid_shape @mesh axes = [i]``) and calls the list function.

``shard.grid_shape`` has no lowering outside a partitioned module, so ``run_dynamic`` runs the
list function itself: it drops the wrapper (the only function reading the grid) and calls the
list function from an entry that takes the axis sizes as data (an ``int64`` tensor), so the
text compiled is the same for every device count, which only the data says.

``apportion.sharding.forms.dynamic_mlir`` renders a plan's (``OpSplit`` per op).

>>> from apportion.frontend.json_format import load
>>> from apportion.mlir.shard.values import Grid, GridAxis, OpSplit
>>> p = load("examples/mlp.json")
>>> splits = [OpSplit((("n", ("tp",)),), "float16", "n:tp") if op.name != "down" else
...           OpSplit((), "float16", "replicated") for op in p.ops]
>>> text = dynamic_mlir(p, Grid((GridAxis("tp", 4, symbol="N"),), "tp=N~4"), splits,
...                     "given")                                         # doctest: +SKIP
>>> "shard.grid_shape @mesh axes = [0]" in text                          # doctest: +SKIP
True
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from apportion.errors import EmitError
from apportion.ir.affine import AffineExpr
from apportion.ir.kinds import REDUCERS
from apportion.ir.op import Op
from apportion.ir.program import Program, TensorType
from apportion.mlir.bodies import REDUCER_OPS
from apportion.mlir.builder import symbol_name
from apportion.mlir.keys import pack_key
from apportion.mlir.shard.body import (
    Block,
    declarations,
    finished,
    generic,
    identity_map,
    index_map,
    opaque,
    pointwise_body,
    reduce_body,
    render_op,
    tensor_type,
)
from apportion.mlir.shard.dialect import GRID, grid_op
from apportion.mlir.shard.finish import cast_body
from apportion.mlir.shard.values import Grid, OpSplit
from apportion.mlir.types import FLOAT_TYPES, INDEX_MAX, compute_type
from apportion.mlir.types import mlir_type as elt
from apportion.mlir.upstream import run_function, verify_upstream

#: a size or offset in index arithmetic: a Python int when static, else an SSA value
Val = int | str


def _fn(name: str) -> str:
    return f'@"{symbol_name(name)}"'


class _Index:
    """Index arithmetic into a block, folded where both sides are static."""

    def __init__(self, blk: Block) -> None:
        self.blk = blk

    def v(self, x: Val) -> str:
        return x if isinstance(x, str) else self.blk.const(x, "index")

    def _op(self, name: str, a: Val, b: Val, stem: str) -> str:
        out = self.blk.fresh(stem)
        self.blk.emit(f"{out} = arith.{name} {self.v(a)}, {self.v(b)} : index")
        return out

    def add(self, a: Val, b: Val) -> Val:
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        if a == 0:
            return b
        if b == 0:
            return a
        return self._op("addi", a, b, "sum")

    def mul(self, a: Val, b: Val) -> Val:
        if isinstance(a, int) and isinstance(b, int):
            return a * b
        if a == 1:
            return b
        if b == 1:
            return a
        return self._op("muli", a, b, "prod")

    def chunk(self, n: Val, k: Val, c: str) -> tuple[Val, Val]:
        """Shard ``c`` of ``n`` elements cut in ``k`` as ``spec.chunk`` cuts it: ``q = n // k``
        each, the first ``r = n % k`` shards one more; ``(offset, size)``."""
        q = n // k if isinstance(n, int) and isinstance(k, int) else self._op("divui", n, k,
                                                                               "q")
        r = n % k if isinstance(n, int) and isinstance(k, int) else self._op("remui", n, k, "r")
        lo = self.add(self.mul(c, q), self._op("minui", c, r, "extra"))
        lt = self.blk.fresh("longer")
        self.blk.emit(f"{lt} = arith.cmpi ult, {c}, {self.v(r)} : index")
        one = self.blk.fresh("one")
        self.blk.emit(f"{one} = arith.select {lt}, {self.v(1)}, {self.v(0)} : index")
        return lo, self.add(q, one)


def _split_dims(e: AffineExpr, split: Mapping[str, Any]) -> bool:
    return any(d in split for d in e.dims)


def _local_expr(e: AffineExpr) -> AffineExpr:
    """What a per-shard function reads of an operand dim the wrapper cut to what ``e``
    reaches: the terms from 0 (a single term's stride is the cut's)."""
    if len(e.terms) == 1:
        return AffineExpr.dim(e.terms[0][0])
    return AffineExpr(e.terms, 0)


def _reach(ix: _Index, e: AffineExpr, sizes: Mapping[str, Val]) -> Val:
    """Elements of a dim that ``e`` reaches over dims of ``sizes`` (a single term: its count,
    cut with the term's stride)."""
    if not e.terms:
        return 1
    if len(e.terms) == 1:
        return sizes[e.terms[0][0]]
    total: Val = 1
    for d, c in e.terms:
        total = ix.add(total, ix.mul(c, ix.add(sizes[d], -1) if isinstance(sizes[d], int)
                                     else _minus_one(ix, sizes[d])))
    return total


def _minus_one(ix: _Index, v: str) -> str:
    out = ix.blk.fresh("less")
    ix.blk.emit(f"{out} = arith.subi {v}, {ix.v(1)} : index")
    return out


def _uncut(e: AffineExpr, n: int, sizes: Mapping[str, int]) -> bool:
    """True when reading a dim of ``n`` through ``e`` over static ``sizes`` reads it whole in
    order (no cut needed)."""
    if e.const:
        return False
    if not e.terms:
        return n == 1
    if len(e.terms) == 1:
        return e.terms[0][1] == 1 and sizes[e.terms[0][0]] == n
    return 1 + sum(c * (sizes[d] - 1) for d, c in e.terms) == n


def _empty(blk: Block, stem: str, shape: Sequence[Val], e: str) -> str:
    name = blk.fresh(f"{stem}_init")
    dyn = [s for s in shape if isinstance(s, str)]
    ty = tensor_type([s if isinstance(s, int) else None for s in shape], e)
    blk.emit(f"{name} = tensor.empty({', '.join(dyn)}) : {ty}")
    return name


def _static(shape: Sequence[Val]) -> tuple[int | None, ...]:
    return tuple(s if isinstance(s, int) else None for s in shape)


class _Dynamic:
    def __init__(self, program: Program, grid: Grid) -> None:
        if not grid.symbolic:
            raise EmitError(f"mesh {grid.spec} has no symbolic axis size: the "
                            "dynamic-list form is for a run-time device count (tp=N~4); a "
                            "static mesh has the partitioned and unrolled forms")
        self.program, self.grid = program, grid
        self.decl: dict[str, str] = {}
        self.funcs: list[str] = []
        self.blk = Block(declarations=self.decl)
        self.ix = _Index(self.blk)
        self.counts: dict[str, Val] = {}
        self.vals: dict[str, str] = {}

    # the per-shard functions ------------------------------------------------------------

    def whole_fn(self, op: Op) -> tuple[str, list[str]]:
        """The function of an opaque op (a fallback, a construction): ``render_op``'s call of
        its declared function on whole tensors; no axis may split it."""
        name = f"{self.program.name}.shard.{op.name}"
        blk = Block(declarations=self.decl)
        types = self.program.tensor_map
        reads = list(dict.fromkeys(a.tensor for a in op.ins))
        vals = {t: blk.fresh(f"arg_{t}") for t in reads}
        out = render_op(blk, op, types, vals)
        ot = types[op.out.tensor]
        sig = ", ".join(f"{vals[t]}: {tensor_type(types[t].shape, elt(types[t].dtype))}"
                        for t in reads)
        res = tensor_type(ot.shape, elt(ot.dtype))
        self.funcs.append("\n".join([f"func.func private {_fn(name)}({sig}) -> {res} {{",
                                     blk.text(), f"  return {out} : {res}", "}"]))
        return name, reads

    def shard_fn(self, op: Op, st: OpSplit, pack: bool) -> str:
        """The per-shard function of ``op`` split as ``st`` (see the module docstring): its
        arguments are each split dim's size, each split reduction dim's offset where an argmax
        packs global indices (``pack``), then each operand's cut, by position."""
        program = self.program
        split = st.split_map
        name = f"{program.name}.shard.{op.name}"
        blk = Block(declarations=self.decl)
        ix = _Index(blk)
        sizes: dict[str, Val] = dict(op.sizes)
        starts: dict[str, str] = {}
        args: list[str] = []
        for d in op.dim_names:
            if d in split:
                sizes[d] = blk.fresh(f"n_{d}")
                args.append(f"{sizes[d]}: index")
        if pack:
            for d in op.reduction_dims:
                if d in split:
                    starts[d] = blk.fresh(f"at_{d}")
                    args.append(f"{starts[d]}: index")
        dims = list(op.dim_names)
        ins = []
        for k, acc in enumerate(op.ins):
            t = program.tensor(acc.tensor)
            e_t = elt(t.dtype)
            index, whole, _, _ = _digit_view(acc.index, t.shape, op.sizes)
            exprs = [e if _uncut(e, n, op.sizes) else _local_expr(e)
                     for e, n in zip(index, whole, strict=True)]
            shape = [None if _split_dims(e, split) else n if _uncut(e, n, op.sizes)
                     else _reach_static(e, op.sizes) for e, n in zip(index, whole, strict=True)]
            v = blk.fresh(f"in{k}_{acc.tensor}")
            ty = tensor_type(shape, e_t)
            args.append(f"{v}: {ty}")
            ins.append((v, ty, e_t, index_map(dims, exprs)))
        out_t = program.tensor(op.out.tensor)
        held = st.held
        out_exprs = [_local_expr(e) if _split_dims(e, split) else e for e in op.out.index]
        out_shape: list[Val] = [_reach(ix, e, sizes) if _split_dims(e, split) else n
                                for e, n in zip(op.out.index, out_t.shape, strict=True)]
        omap = index_map(dims, out_exprs)
        ty = compute_type(op.kind, [program.tensor(a.tensor).dtype for a in op.ins])
        extra = _ranges(blk, dims, sizes, [m for *_, m in ins] + [omap])
        if op.kind.elementwise:
            out = self._pointwise(blk, op, ins, extra, out_shape, elt(held), omap, ty, dims)
        else:
            out = self._reduce(blk, op, st, ins, extra, out_shape, held, omap, ty, dims, starts,
                               pack)
        res = tensor_type(_static(out_shape), elt(held))
        self.funcs.append("\n".join([
            f"func.func private {_fn(name)}({', '.join(args)}) -> {res} {{", blk.text(),
            f"  return {out} : {res}", "}"]))
        return name

    def _pointwise(self, blk: Block, op: Op, ins: list[tuple[str, str, str, str]],
                   extra: list[tuple[str, str, str, str]], out_shape: list[Val],
                   out_elt: str, omap: str, ty: str, dims: list[str]) -> str:
        body = pointwise_body(op, [e for _, _, e, _ in ins], ty, out_elt)
        init = _empty(blk, op.out.tensor, out_shape, out_elt)
        return generic(blk, dims, (), ins + extra, [(init, tensor_type(_static(out_shape), out_elt),
                                              out_elt, omap)], body, op.out.tensor)[0]

    def _reduce(self, blk: Block, op: Op, st: OpSplit, ins: list[tuple[str, str, str, str]],
                extra: list[tuple[str, str, str, str]], out_shape: list[Val], held: str,
                omap: str, ty: str, dims: list[str], starts: Mapping[str, str], pack: bool
                ) -> str:
        """A reduction or matmul on the device's part: accumulated into its identity; a mean
        divided by the whole op's count (a device's share of a split mean, as the ``scale``
        finish makes it); an argmax's index global (offsets of split reduction dims added),
        packed with its value into int64 keys when its reduction is split (``pack``)."""
        kind = op.kind
        reducer = kind.reducer
        if reducer is None:
            raise EmitError(f"op {op.name!r}: kind {kind.name!r} has no iteration-space model "
                            "to split over a run-time list of devices")
        body = reduce_body(op, [e for _, _, e, _ in ins], ty, dims, starts)
        stem = op.out.tensor
        st_shape = tensor_type(_static(out_shape), "{}")
        outs = []
        for e, ident in [(ty, reducer.identity)] + ([("i64", INDEX_MAX)] if reducer.pairs
                                                    else []):
            init = _empty(blk, f"{stem}_acc", out_shape, e)
            c = blk.const(ident, e)
            filled = blk.fresh(f"{stem}_id")
            blk.emit(f"{filled} = linalg.fill ins({c} : {e}) outs({init} : "
                     f"{st_shape.format(e)}) -> {st_shape.format(e)}")
            outs.append((filled, st_shape.format(e), e, omap))
        red = op.reduction_dims
        parts = generic(blk, dims, red, ins + extra, outs, body, f"{stem}_acc")
        rank = len(out_shape)
        ident = identity_map(rank)
        held_e = elt(held)
        init = _empty(blk, stem, out_shape, held_e)
        out_ty = st_shape.format(held_e)
        if reducer.pairs and pack:
            # one coordinate spanning every index: the index is global already
            return generic(blk, [f"p{i}" for i in range(rank)], (),
                           [(parts[0], st_shape.format(ty), ty, ident),
                            (parts[1], st_shape.format("i64"), "i64", ident)],
                           [(init, out_ty, held_e, ident)],
                           lambda b, a, o: [pack_key(b, a[0], ty, a[1], "i64", (2**62,), (0,),
                                                     (2**62,))],
                           f"{stem}_keys")[0]
        acc, acc_elt = (parts[1], "i64") if reducer.pairs else (parts[0], ty)
        is_mean = reducer.finish is not None and not reducer.pairs
        count = math.prod(op.sizes[d] for d in red)

        def fin(b: Block, args: list[str], outs_: list[str]) -> list[str]:
            return [finished(b, args[0], acc_elt, held_e, count if is_mean else None)]

        return generic(blk, [f"p{i}" for i in range(rank)], (),
                       [(acc, st_shape.format(acc_elt), acc_elt, ident)],
                       [(init, out_ty, held_e, ident)], fin, stem)[0]

    # the list function -----------------------------------------------------------------

    def op(self, op: Op, st: OpSplit) -> None:
        program, blk, ix = self.program, self.blk, self.ix
        out_t = program.tensor(op.out.tensor)
        if opaque(op):  # a call of the op's opaque function on whole tensors: one replica
            if st.axes:
                raise EmitError(f"op {op.name!r} ({op.kind.name}) is split over {st.label} but "
                                "runs whole as an opaque call")
            name, reads = self.whole_fn(op)
            ot = tensor_type(out_t.shape, elt(out_t.dtype))
            res = blk.fresh(op.out.tensor)
            arg_t = ", ".join(tensor_type(program.tensor(t).shape,
                                          elt(program.tensor(t).dtype)) for t in reads)
            blk.emit(f"{res} = func.call {_fn(name)}({', '.join(self.vals[t] for t in reads)})"
                     f" : ({arg_t}) -> {ot}")
            self.vals[op.out.tensor] = res
            return
        split = st.split_map
        pack = bool(op.kind.reducer and op.kind.reducer.pairs and st.partial)
        fname = self.shard_fn(op, st, pack)
        partial = st.reducer
        held = st.held
        if pack and held != "int64":
            raise EmitError(f"op {op.name!r}: an argmax split over {'*'.join(st.partial)} "
                            f"packs int64 keys, but its partial tensor {out_t.name!r} is held "
                            f"as {held}")
        he = elt(held)
        whole_ty = tensor_type(out_t.shape, he)
        # the whole result the devices' shards go into: a partial one starts at the identity
        init = _empty(blk, f"{out_t.name}_whole", out_t.shape, he)
        if partial is not None:
            c = blk.const(REDUCERS[partial].identity if partial != "argmax" else -math.inf, he)
            filled = blk.fresh(f"{out_t.name}_id")
            blk.emit(f"{filled} = linalg.fill ins({c} : {he}) outs({init} : {whole_ty}) -> "
                     f"{whole_ty}")
            init = filled
        loop_axes = [a for a in self.grid.names if a in st.axes]
        coords: dict[str, str] = {}
        heads: list[tuple[str, str]] = []
        acc = init
        for a in loop_axes:
            iv = blk.fresh(f"at_{a}")
            inner = blk.fresh(f"{out_t.name}_part")
            res = blk.fresh(f"{out_t.name}_{a}")
            blk.emit(f"{res} = scf.for {iv} = {ix.v(0)} to {ix.v(self.counts[a])} step "
                     f"{ix.v(1)} iter_args({inner} = {acc}) -> ({whole_ty}) {{")
            blk.indent += 1
            coords[a] = iv
            heads.append((res, inner))
            acc = inner
        starts: dict[str, Val] = {}
        sizes: dict[str, Val] = {}
        for d, n in op.dims:
            lo: Val = 0
            size: Val = n
            for a in split.get(d, ()):
                off, size = ix.chunk(size, self.counts[a], coords[a])
                lo = ix.add(lo, off)
            starts[d], sizes[d] = lo, size
        args = [ix.v(sizes[d]) for d in op.dim_names if d in split]
        arg_t = ["index"] * len(args)
        if pack:
            args += [ix.v(starts[d]) for d in op.reduction_dims if d in split]
            arg_t += ["index"] * sum(1 for d in op.reduction_dims if d in split)
        for acc_in in op.ins:
            t = program.tensor(acc_in.tensor)
            v, ty = self._cut(self.vals[t.name], t, acc_in.index, split, starts, sizes, op)
            args.append(v)
            arg_t.append(ty)
        out_exprs = list(op.out.index)
        region = [_region(ix, e, n, split, starts, sizes) for e, n in zip(out_exprs, out_t.shape,
                                                                          strict=True)]
        part_shape = tuple(None if _split_dims(e, split) else n
                           for e, n in zip(out_exprs, out_t.shape, strict=True))
        part_ty = tensor_type(part_shape, he)
        part = blk.fresh(f"{out_t.name}_shard")
        blk.emit(f"{part} = func.call {_fn(fname)}({', '.join(args)}) : ({', '.join(arg_t)}) -> "
                 f"{part_ty}")
        offs = ", ".join(str(lo) if isinstance(lo, int) else lo for lo, _, _ in region)
        lens = ", ".join(str(n) if isinstance(n, int) else n for _, n, _ in region)
        strides = ", ".join(str(s) for _, _, s in region)
        where = f"[{offs}] [{lens}] [{strides}]"
        if partial is not None:
            have = blk.fresh(f"{out_t.name}_have")
            blk.emit(f"{have} = tensor.extract_slice {acc}{where} : {whole_ty} to {part_ty}")
            floats = he in FLOAT_TYPES
            ops = REDUCER_OPS.get(partial)
            combine = None if ops is None else ops.elementwise(floats)
            if combine is None:
                raise EmitError(f"op {op.name!r}: partial {partial!r} of {held} has no "
                                "elementwise combine")
            both = blk.fresh(f"{out_t.name}_combined")
            blk.emit(f"{both} = {combine} {have}, {part} : {part_ty}")
            part = both
        put = blk.fresh(f"{out_t.name}_put")
        blk.emit(f"{put} = tensor.insert_slice {part} into {acc}{where} : {part_ty} into "
                 f"{whole_ty}")
        done = put
        for res, _ in reversed(heads):
            blk.emit(f"scf.yield {done} : {whole_ty}")
            blk.indent -= 1
            blk.emit("}")
            done = res
        unpack = partial == "argmax"
        if held != out_t.dtype or unpack:
            oe = elt(out_t.dtype)
            cinit = _empty(blk, out_t.name, out_t.shape, oe)
            ident = identity_map(len(out_t.shape))
            done = generic(blk, [f"p{i}" for i in range(len(out_t.shape))], (),
                           [(done, whole_ty, he, ident)],
                           [(cinit, tensor_type(out_t.shape, oe), oe, ident)],
                           cast_body(unpack, he, oe), f"{out_t.name}_whole")[0]
        self.vals[out_t.name] = done

    def _cut(self, whole: str, t: TensorType, index: Sequence[AffineExpr],
             split: Mapping[str, Any], starts: Mapping[str, Val], sizes: Mapping[str, Val],
             op: Op) -> tuple[str, str]:
        """The part of whole tensor ``t`` a device reads through ``index`` over its ranges:
        its shard, or the range or window a shifted, strided or partial read reaches. A dim
        read through a sum of dims whose coefficients are their strides (a head view
        ``q[t, 64*h+d]``) is first expanded into them (``_digit_view``), so that each digit is
        cut by its own range (an inner digit's split is a strided set of rows)."""
        e_t = elt(t.dtype)
        exprs, grown, precut, groups = _digit_view(index, t.shape, op.sizes)
        ty = tensor_type(t.shape, e_t)
        value = whole
        if any(c is not None for c in precut):
            cut = tuple(n if c is None else c[1] for c, n in zip(precut, t.shape, strict=True))
            part = self.blk.fresh(f"{t.name}_span")
            self.blk.emit(f"{part} = tensor.extract_slice {whole}"
                          f"[{', '.join(str(0 if c is None else c[0]) for c in precut)}] "
                          f"[{', '.join(map(str, cut))}] [{', '.join('1' for _ in cut)}] : "
                          f"{ty} to {tensor_type(cut, e_t)}")
            value, ty = part, tensor_type(cut, e_t)
        if len(grown) != len(t.shape):
            view = self.blk.fresh(f"{t.name}_digits")
            gty = tensor_type(grown, e_t)
            self.blk.emit(f"{view} = tensor.expand_shape {value} "
                          f"[{', '.join(str(g) for g in groups)}] output_shape "
                          f"[{', '.join(map(str, grown))}] : {ty} into {gty}")
            value, ty = view, gty
        region = [(0, n, 1) if _uncut(e, n, op.sizes) and not _split_dims(e, split)
                  else _region(self.ix, e, n, split, starts, sizes)
                  for e, n in zip(exprs, grown, strict=True)]
        if all(r == (0, n, 1) for r, n in zip(region, grown, strict=True)):
            return value, ty
        shape = tuple(n if isinstance(n, int) else None for _, n, _ in region)
        cty = tensor_type(shape, e_t)
        out = self.blk.fresh(f"{t.name}_cut")
        self.blk.emit(f"{out} = tensor.extract_slice {value}"
                      f"[{', '.join(str(v) for v, _, _ in region)}] "
                      f"[{', '.join(str(v) for _, v, _ in region)}] "
                      f"[{', '.join(str(v) for _, _, v in region)}] : {ty} to {cty}")
        return out, cty


def _digit_view(index: Sequence[AffineExpr], shape: Sequence[int], sizes: Mapping[str, int]
                ) -> tuple[list[AffineExpr], list[int], list[tuple[int, int] | None],
                           list[list[int]]]:
    """An operand's dims read through a mixed radix of op dims (``AffineExpr.radix_digits``
    over the whole op's sizes) as one dim per digit: the reads (single dims), the grown
    shape, per original dim the static range ``(offset, span)`` cut before expanding (None:
    the whole dim) and the expansion's groups."""
    exprs: list[AffineExpr] = []
    grown: list[int] = []
    precut: list[tuple[int, int] | None] = []
    groups: list[list[int]] = []
    for e, n in zip(index, shape, strict=True):
        digits = AffineExpr(e.terms, 0).radix_digits(dict(sizes)) if len(e.terms) > 1 \
            else None
        if digits is None:
            groups.append([len(grown)])
            grown.append(n)
            exprs.append(e)
            precut.append(None)
            continue
        span = math.prod(sizes[d] for d in digits)
        precut.append((e.const, span) if e.const or span != n else None)
        groups.append(list(range(len(grown), len(grown) + len(digits))))
        grown += [sizes[d] for d in digits]
        exprs += [AffineExpr.dim(d) for d in digits]
    return exprs, grown, precut, groups


def _reach_static(e: AffineExpr, sizes: Mapping[str, int]) -> int:
    if not e.terms:
        return 1
    if len(e.terms) == 1:
        return sizes[e.terms[0][0]]
    return 1 + sum(c * (sizes[d] - 1) for d, c in e.terms)


def _region(ix: _Index, e: AffineExpr, n: int, split: Mapping[str, Any],
            starts: Mapping[str, Val], sizes: Mapping[str, Val]) -> tuple[Val, Val, int]:
    """``(offset, size, stride)`` of a tensor dim of ``n`` that ``e`` reaches over a device's
    op ranges: a dim ``e`` does not reach through a split dim, whole where ``e`` reads it in
    order."""
    if not _split_dims(e, split) and e.terms and len(e.terms) > 1 and not e.const and \
            _reach_static(e, {d: s for d, s in sizes.items() if isinstance(s, int)}) == n:
        return 0, n, 1
    lo: Val = e.const
    for d, c in e.terms:
        lo = ix.add(lo, ix.mul(c, starts[d]))
    if len(e.terms) == 1:
        return lo, sizes[e.terms[0][0]], e.terms[0][1]
    return lo, _reach(ix, e, sizes), 1


def _ranges(blk: Block, dims: Sequence[str], sizes: Mapping[str, Val], maps: Sequence[str]
            ) -> list[tuple[str, str, str, str]]:
    """An operand that only gives linalg the range of each loop no operand indexes alone (a
    window's ``x[h + kh]``: linalg reads a loop's range from a dim indexed by it alone): an
    empty tensor of those loops' sizes, read by no body. None when every loop has one."""
    alone = set()
    for m in maps:
        for r in m.split("-> (", 1)[1].rstrip(")>").split(", "):
            if re.fullmatch(r"d\d+", r):
                alone.add(int(r[1:]))
    missing = [i for i in range(len(dims)) if i not in alone]
    if not missing:
        return []
    shape = [sizes[dims[i]] for i in missing]
    init = _empty(blk, "ranges", shape, "i8")
    ty = tensor_type(_static(shape), "i8")
    m = f"affine_map<({', '.join(f'd{i}' for i in range(len(dims)))}) -> " \
        f"({', '.join(f'd{i}' for i in missing)})>"
    return [(init, ty, "i8", m)]


def _list_name(program: Program) -> str:
    return f"{program.name}.list"


def dynamic_mlir(program: Program, grid: Grid, splits: Sequence[OpSplit], method: str) -> str:
    """The dynamic-list form of ``program`` over a grid with symbolic axes, each op divided
    as ``splits`` says (by the plan's ``method``; see the module docstring), verified
    upstream. The same text serves every device count."""
    dyn = _Dynamic(program, grid)
    mesh, blk = grid, dyn.blk
    sym_axes = [a for a in mesh.axes if a.symbolic]
    args = []
    for a in mesh.axes:
        if a.symbolic:
            v = blk.fresh(f"devices_{a.name}")
            args.append(f"{v}: index")
            dyn.counts[a.name] = v
        else:
            dyn.counts[a.name] = a.size
    for name in program.inputs:
        t = program.tensor(name)
        v = blk.fresh(f"arg_{name}")
        args.append(f"{v}: {tensor_type(t.shape, elt(t.dtype))}")
        dyn.vals[name] = v
    for op, st in zip(program.ops, splits, strict=True):
        dyn.op(op, st)
    outs = [tensor_type(program.tensor(n).shape, elt(program.tensor(n).dtype))
            for n in program.outputs]
    ret = [dyn.vals[n] for n in program.outputs]
    list_fn = "\n".join([
        f"func.func private {_fn(_list_name(program))}({', '.join(args)}) -> "
        f"({', '.join(outs)}) {{", blk.text(),
        f"  return {', '.join(ret)} : {', '.join(outs)}", "}"])
    # the wrapper: the caller's signature, the device counts read from the grid
    w = Block()
    w_args = []
    call = []
    for a in sym_axes:
        n = w.fresh(f"devices_{a.name}")
        w.emit(f"{n} = shard.grid_shape @{GRID} axes = [{mesh.index(a.name)}] : index")
        call.append(n)
    in_t = []
    for name in program.inputs:
        t = program.tensor(name)
        v = w.fresh(f"arg_{name}")
        w_args.append(f"{v}: {tensor_type(t.shape, elt(t.dtype))}")
        in_t.append(tensor_type(t.shape, elt(t.dtype)))
        call.append(v)
    r = w.fresh("result")
    lhs = r if len(outs) == 1 else f"{r}:{len(outs)}"
    w.emit(f"{lhs} = func.call {_fn(_list_name(program))}({', '.join(call)}) : "
           f"({', '.join(['index'] * len(sym_axes) + in_t)}) -> ({', '.join(outs)})")
    rets = [r] if len(outs) == 1 else [f"{r}#{k}" for k in range(len(outs))]
    wrapper = "\n".join([
        f"func.func {_fn(program.name)}({', '.join(w_args)}) -> ({', '.join(outs)}) attributes "
        f"{{apportion.form = \"dynamic\", apportion.mesh = \"{mesh.spec}\", apportion.method = "
        f"\"{method}\"}} {{", w.text(),
        f"  return {', '.join(rets)} : {', '.join(outs)}", "}"])
    fake = Block(declarations=dyn.decl)
    text = "\n".join([grid_op(mesh), *declarations(fake), *dyn.funcs, list_fn, wrapper]) + "\n"
    verify_upstream(text)
    return text


def runnable_mlir(text: str, program: Program, mesh: Grid) -> str:
    """The dynamic-list form ``text`` made runnable by upstream MLIR's execution engine: the
    wrapper reading the grid (``shard.grid_shape`` lowers only inside a partitioned module)
    dropped, and an entry ``@"PROG.run"(%counts: tensor<Kxi64>, inputs...)`` that passes each
    symbolic axis's size (mesh order) to the list function. It takes no size: the module
    compiled is the same for every device count."""
    sym = [a for a in mesh.axes if a.symbolic]
    head = f"func.func {_fn(program.name)}("
    at = text.find(head)
    if at < 0 or "shard.grid_shape" not in text[at:]:
        raise EmitError(f"not a dynamic-list form of {program.name!r}: no wrapper "
                        f"{_fn(program.name)} reading the grid")
    b = Block()
    counts = b.fresh("counts")
    args = [f"{counts}: tensor<{len(sym)}xi64>"]
    call = []
    for k, _ in enumerate(sym):
        c = b.const(k, "index")
        raw = b.fresh("raw")
        b.emit(f"{raw} = tensor.extract {counts}[{c}] : tensor<{len(sym)}xi64>")
        n = b.fresh("devices")
        b.emit(f"{n} = arith.index_cast {raw} : i64 to index")
        call.append(n)
    in_t, out_t = [], []
    for name in program.inputs:
        t = program.tensor(name)
        v = b.fresh(f"arg_{name}")
        ty = tensor_type(t.shape, elt(t.dtype))
        args.append(f"{v}: {ty}")
        in_t.append(ty)
        call.append(v)
    for name in program.outputs:
        t = program.tensor(name)
        out_t.append(tensor_type(t.shape, elt(t.dtype)))
    r = b.fresh("result")
    lhs = r if len(out_t) == 1 else f"{r}:{len(out_t)}"
    b.emit(f"{lhs} = func.call {_fn(_list_name(program))}({', '.join(call)}) : "
           f"({', '.join(['index'] * len(sym) + in_t)}) -> ({', '.join(out_t)})")
    rets = [r] if len(out_t) == 1 else [f"{r}#{k}" for k in range(len(out_t))]
    entry = "\n".join([f"func.func {_fn(_run_name(program))}({', '.join(args)}) -> "
                       f"({', '.join(out_t)}) {{", b.text(),
                       f"  return {', '.join(rets)} : {', '.join(out_t)}", "}"])
    return text[:at] + entry + "\n"


def _run_name(program: Program) -> str:
    return f"{program.name}.run"


def run_dynamic(text: str, program: Program, mesh: Grid, inputs: Mapping[str, Any],
                sizes: Mapping[str, int]) -> dict[str, Any]:
    """Run the dynamic-list form ``text`` of ``program`` (``runnable_mlir``) with upstream
    MLIR's execution engine at the symbolic axis sizes ``sizes`` (symbol -> devices), given as
    data. Returns each output by name."""
    import numpy as np

    sym = [a for a in mesh.axes if a.symbolic]
    missing = [a.symbol for a in sym if a.symbol not in sizes]
    if missing:
        raise EmitError(f"run of the dynamic-list form of {program.name!r}: no size for "
                        f"symbol {', '.join(map(str, missing))} of mesh {mesh.spec}")
    bad = {a.symbol: sizes[a.symbol] for a in sym
           if not isinstance(sizes[a.symbol], int) or sizes[a.symbol] < 1}
    if bad:
        raise EmitError(f"run of the dynamic-list form of {program.name!r}: mesh {mesh.spec} "
                        f"needs at least one device per axis, got {bad}")
    arrays = [np.array([sizes[a.symbol] for a in sym], dtype=np.int64),
              *(inputs[n] for n in program.inputs)]
    outs = run_function(runnable_mlir(text, program, mesh), symbol_name(_run_name(program)),
                        arrays, [(program.tensor(n).shape, program.tensor(n).dtype)
                                 for n in program.outputs],
                        ["int64", *(program.tensor(n).dtype for n in program.inputs)])
    return dict(zip(program.outputs, outs, strict=True))
