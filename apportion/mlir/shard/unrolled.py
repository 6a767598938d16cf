"""The per-shard unrolled form (form 4): the mesh schedule of a static mesh as one function per
distinct device segment (``@PROG.dD.sS``, the device's shards of a run of ops as
``linalg.generic`` on its local tensors; devices with equal shards share one) and a wrapper
``@PROG`` with the caller's signature: it *shards* the whole inputs into each device's boxes
(``tensor.extract_slice``), calls every device's segment of each compute stage, performs each
collective between devices by the boxes the schedule lists (a gather copies each element from
the group's device whose box holds it; a reduction combines the group's arrays in rank order
and casts the total to the dtype the tensor has once whole; an argmax's keys reduce by max and
unpack to the index), runs a split mean's or argmax's finish on each device, and *unshards*
the outputs (``tensor.insert_slice`` of each box, one replica each) into whole tensors.

The text is verified by upstream MLIR 22 before it is returned; the whole module is ordinary
MLIR on tensors (no ``shard`` ops: each device is a call), so upstream's pipeline can run it.
"""

from __future__ import annotations

import math

from apportion.errors import EmitError
from apportion.ir.program import Program, TensorType
from apportion.mlir.bodies import REDUCER_OPS
from apportion.mlir.builder import symbol_name
from apportion.mlir.shard.body import Block, declarations, generic, identity_map, render_op
from apportion.mlir.shard.body import tensor_type as ttype
from apportion.mlir.shard.dialect import grid_op
from apportion.mlir.shard.finish import cast_body, finish_op
from apportion.mlir.shard.values import Grid
from apportion.mlir.types import FLOAT_TYPES
from apportion.mlir.types import mlir_type as elt
from apportion.mlir.upstream import verify_upstream
from apportion.plans.tiles import Region
from apportion.schedule.mesh import (
    REDUCING,
    Collective,
    Compute,
    MeshFinish,
    MeshSchedule,
    box_shape,
    intersect,
    within,
)


def _fn(name: str) -> str:
    return f'@"{symbol_name(name)}"'


class _Unrolled:
    def __init__(self, ms: MeshSchedule) -> None:
        self.ms = ms
        self.blk = Block()
        self.funcs: dict[int, tuple[str, str]] = {}  # id(schedule) -> (name, text)
        self.env: list[dict[str, tuple[str, TensorType]]] = [{} for _ in ms.devices]

    # device segments -------------------------------------------------------------------

    def segment(self, name: str, prog: Program) -> str:
        """The function of one device segment (once per distinct schedule)."""
        blk = Block(declarations=self.blk.declarations)
        vals: dict[str, str] = {}
        args = []
        for n in prog.inputs:
            a = blk.fresh(f"arg_{n}")
            vals[n] = a
            t = prog.tensor(n)
            args.append(f"{a}: {ttype(t.shape, elt(t.dtype))}")
        for op in prog.ops:
            vals[op.out.tensor] = render_op(blk, op, prog.tensor_map, vals)
        outs = [ttype(prog.tensor(n).shape, elt(prog.tensor(n).dtype)) for n in prog.outputs]
        return "\n".join([
            f"func.func private {_fn(name)}({', '.join(args)}) -> ({', '.join(outs)}) {{",
            blk.text(), f"  return {', '.join(vals[n] for n in prog.outputs)} : "
                        f"{', '.join(outs)}" if prog.outputs else "  return", "}"])

    def compute(self, stage: Compute) -> None:
        for d, launch in enumerate(stage.launches):
            prog = launch.schedule.program
            key = id(launch.schedule)
            if key not in self.funcs:
                self.funcs[key] = (prog.name, self.segment(prog.name, prog))
            fname = self.funcs[key][0]
            env = self.env[d]
            args = [env[n][0] for n in prog.inputs]
            arg_t = [ttype(prog.tensor(n).shape, elt(prog.tensor(n).dtype)) for n in prog.inputs]
            outs = [prog.tensor(n) for n in prog.outputs]
            out_t = [ttype(t.shape, elt(t.dtype)) for t in outs]
            if not outs:
                continue
            res = self.blk.fresh(f"d{d}_{launch.name}")
            lhs = res if len(outs) == 1 else f"{res}:{len(outs)}"
            self.blk.emit(f"{lhs} = func.call {_fn(fname)}({', '.join(args)}) : "
                          f"({', '.join(arg_t)}) -> ({', '.join(out_t)})")
            for k, t in enumerate(outs):
                env[t.name] = (res if len(outs) == 1 else f"{res}#{k}", t)

    # collectives ----------------------------------------------------------------------

    def _slice(self, value: str, t: TensorType, box: Region, stem: str) -> tuple[str, TensorType]:
        """``box`` (in ``value``'s own coordinates) of ``value``."""
        shape = box_shape(box)
        if tuple(shape) == tuple(t.shape):
            return value, t
        out = self.blk.fresh(stem)
        e = elt(t.dtype)
        self.blk.emit(f"{out} = tensor.extract_slice {value}"
                      f"[{', '.join(str(lo) for lo, _ in box)}] [{', '.join(map(str, shape))}] "
                      f"[{', '.join('1' for _ in box)}] : {ttype(t.shape, e)} to "
                      f"{ttype(shape, e)}")
        return out, TensorType(t.name, tuple(shape), t.dtype)

    def collective(self, c: Collective) -> None:
        src_dtype = c.dtype
        out_dtype = c.out_dtype
        reduced: dict[tuple[int, ...], tuple[str, TensorType]] = {}
        results = []
        for d, (src, dst) in enumerate(zip(c.src_boxes, c.dst_boxes, strict=True)):
            group = c.group(d)
            if c.kind == "slice":
                v, t = self.env[d][c.source]
                results.append(self._slice(v, t, within(dst, src), f"d{d}_{c.result}"))
            elif c.kind not in REDUCING:  # gathers, all-to-alls, reads of peers' memory
                results.append(self._gather(c, d, group))
            else:
                if group not in reduced:
                    reduced[group] = self._reduce(c, group, src_dtype, out_dtype)
                v, t = reduced[group]
                results.append(self._slice(v, t, within(dst, src), f"d{d}_{c.result}"))
        for d, (v, t) in enumerate(results):
            self.env[d][c.result] = (v, TensorType(c.result, t.shape, t.dtype))

    def _gather(self, c: Collective, d: int, group: tuple[int, ...]) -> tuple[str, TensorType]:
        dst = c.dst_boxes[d]
        shape = box_shape(dst)
        e = elt(c.dtype)
        acc = self.blk.fresh(f"d{d}_{c.result}_init")
        self.blk.emit(f"{acc} = tensor.empty() : {ttype(shape, e)}")
        for p in group:
            part = intersect(c.src_boxes[p], dst)
            if part is None:
                continue
            v, t = self.env[p][c.source]
            piece, pt = self._slice(v, t, within(part, c.src_boxes[p]), f"d{p}_{c.source}_part")
            at = within(part, dst)
            nxt = self.blk.fresh(f"d{d}_{c.result}")
            self.blk.emit(f"{nxt} = tensor.insert_slice {piece} into {acc}"
                          f"[{', '.join(str(lo) for lo, _ in at)}] "
                          f"[{', '.join(map(str, box_shape(part)))}] "
                          f"[{', '.join('1' for _ in at)}] : {ttype(pt.shape, e)} into "
                          f"{ttype(shape, e)}")
            acc = nxt
        return acc, TensorType(c.result, tuple(shape), c.dtype)

    def _reduce(self, c: Collective, group: tuple[int, ...], src_dtype: str, out_dtype: str
                ) -> tuple[str, TensorType]:
        """The group's arrays combined in rank order, then cast (or unpacked) elementwise."""
        assert c.reducer is not None
        parts = [self.env[p][c.source] for p in group]
        shape = parts[0][1].shape
        e = elt(src_dtype)
        ty = ttype(shape, e)
        floats = e in FLOAT_TYPES
        ops = REDUCER_OPS.get(c.reducer)
        combine = None if ops is None else ops.elementwise(floats)
        if combine is None:
            raise EmitError(f"collective on tensor {c.tensor!r}: reducer {c.reducer!r} over "
                            f"{src_dtype} has no elementwise combine in the unrolled form")
        acc = parts[0][0]
        for v, _ in parts[1:]:  # tensors of the same shape combine elementwise
            nxt = self.blk.fresh(f"{c.result}_sum")
            self.blk.emit(f"{nxt} = {combine} {acc}, {v} : {ty}")
            acc = nxt
        unpack = c.reducer == "argmax" and c.unpack
        if src_dtype == out_dtype and not unpack:
            return acc, TensorType(c.result, shape, src_dtype)
        oe = elt(out_dtype)
        init = self.blk.fresh(f"{c.result}_init")
        self.blk.emit(f"{init} = tensor.empty() : {ttype(shape, oe)}")
        ident = identity_map(len(shape))

        body = cast_body(unpack, e, oe)

        out = generic(self.blk, [f"p{i}" for i in range(len(shape))], (),
                      [(acc, ty, e, ident)], [(init, ttype(shape, oe), oe, ident)], body,
                      f"{c.result}_whole")[0]
        return out, TensorType(c.result, shape, out_dtype)

    def finish(self, stage: MeshFinish) -> None:
        for d, part in enumerate(stage.parts):
            env = self.env[d]
            types = {n: env[n][1] for n in part.sources}
            shape = types[part.sources[0]].shape
            types[part.result] = TensorType(part.result, shape, part.dtype)
            v = finish_op(self.blk, part, types, {n: env[n][0] for n in part.sources})
            env[part.result] = (v, types[part.result])


def unrolled_mlir(ms: MeshSchedule, grid: Grid | None = None) -> str:
    """The per-shard unrolled form of a lowered mesh schedule (a static mesh), verified
    upstream; ``grid`` adds the mesh's ``shard.grid`` (its axes' names, levels and peers) for
    reference.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.sharding.mesh import parse
    >>> from apportion.sharding.search import search
    >>> from apportion.sharding.lower import lower_plan
    >>> text = unrolled_mlir(lower_plan(search(load("examples/mlp.json"), parse("tp=2"))))
    >>> 'func.func @"mlp"(' in text and 'func.call @"mlp.d0.s0"' in text
    True
    """
    u = _Unrolled(ms)
    program = ms.program
    args = []
    for name in program.inputs:
        t = program.tensor(name)
        a = u.blk.fresh(f"arg_{name}")
        args.append(f"{a}: {ttype(t.shape, elt(t.dtype))}")
        for d, dev in enumerate(ms.devices):  # shard: each device's box of the input
            for pl in dev.inputs:
                if pl.tensor == name:
                    u.env[d][pl.local] = u._slice(a, t, pl.box, f"d{d}_{pl.local}")
    for stage in ms.stages:
        if isinstance(stage, Compute):
            u.compute(stage)
        elif isinstance(stage, MeshFinish):
            u.finish(stage)
        else:
            u.collective(stage)
    rets, outs = [], []
    for k, name in enumerate(program.outputs):  # unshard: one replica of each box
        t = program.tensor(name)
        e = elt(t.dtype)
        acc = u.blk.fresh(f"{name}_init")
        u.blk.emit(f"{acc} = tensor.empty() : {ttype(t.shape, e)}")
        done: set[Region] = set()
        for d, dev in enumerate(ms.devices):
            pl = dev.outputs[k]
            if pl.box in done:
                continue
            done.add(pl.box)
            v, vt = u.env[d][pl.local]
            if vt.dtype != t.dtype:
                raise EmitError(f"output {name!r}: device {d} holds it as {vt.dtype}, the "
                                f"program's is {t.dtype}")
            nxt = u.blk.fresh(name)
            u.blk.emit(f"{nxt} = tensor.insert_slice {v} into {acc}"
                       f"[{', '.join(str(lo) for lo, _ in pl.box)}] "
                       f"[{', '.join(map(str, box_shape(pl.box)))}] "
                       f"[{', '.join('1' for _ in pl.box)}] : {ttype(vt.shape, e)} into "
                       f"{ttype(t.shape, e)}")
            acc = nxt
        if math.prod(t.shape) and not done:
            raise EmitError(f"output {name!r}: no device holds it")
        rets.append(acc)
        outs.append(ttype(t.shape, e))
    head = (f"func.func {_fn(program.name)}({', '.join(args)}) -> ({', '.join(outs)}) "
            f"attributes {{apportion.form = \"unrolled\", apportion.mesh = \"{ms.mesh}\", "
            f"apportion.devices = {len(ms.devices)} : i64}} {{")
    parts = [grid_op(grid)] if grid is not None else []
    parts += [*declarations(u.blk), *(text for _, text in u.funcs.values()), head, u.blk.text(),
              f"  return {', '.join(rets)} : {', '.join(outs)}", "}"]
    text = "\n".join(p for p in parts if p) + "\n"
    verify_upstream(text)
    return text
