"""The sharding proposal's forms of a program in upstream MLIR's ``shard`` dialect, rendered
from what the planner decided (``mlir.shard.values``; ``apportion.sharding.forms`` builds it
from a plan and takes a plan in every form's name).

* ``annotated_mlir(program, grid, annotations)``: the input form, the program as
  ``linalg.generic`` ops on whole tensors with the user's annotations: each annotated tensor's
  value passes through ``shard.shard %v to %sharding`` (the sharding of the value), the grid
  says the mesh (static sizes, ``?`` for a symbolic axis, peered axes as an attribute). What
  upstream's ``--sharding-propagation`` reads.
* ``propagated_mlir(propagated)``: every tensor annotated as apportion's propagation or search made
  it (each op's result with its strategy's output sharding, each operand ``annotate_for_users``
  with the sharding the op reads it in, so a reshard shows as two annotations of one value),
  what upstream's ``--shard-partition`` reads.
* ``partitioned_mlir(partitioned)``: the SPMD form every device runs: per-shard tensor types (a dim
  whose shards differ in size is ``?``), each op on the device's shards, and apportion's
  resharding steps as ``shard`` collectives (``all_gather``, ``all_reduce``,
  ``reduce_scatter``, ``all_to_all``, ``all_slice``; a ``halo`` read as ``update_halo`` on
  the shard grown by upstream's one halo pair (``Reshard.halo``), each device then
  reading its window at its own offset; a ``peer_read``, read in place, is refused: no shard op
  says it); where devices run different local code
  (uneven shards, a device reading at its own offset, a split mean's share), an
  ``scf.index_switch`` on ``shard.process_linear_index`` holds each distinct variant.

Each text is verified by upstream MLIR 22 (``mlir.upstream.verify_upstream``) before it
is returned. Partial values carry ``apportion.partial_axes``/``apportion.reducer`` (see
``dialect``); a peered step's collective carries ``apportion.remote``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from apportion.errors import EmitError
from apportion.ir.program import Program, TensorType
from apportion.mlir.bodies import REDUCER_OPS
from apportion.mlir.builder import symbol_name
from apportion.mlir.shard.body import (
    Block,
    declarations,
    generic,
    identity_map,
    render_op,
    tensor_type,
    value_type,
)
from apportion.mlir.shard.dialect import grid_op, sharding_op
from apportion.mlir.shard.finish import cast_body, finish_op
from apportion.mlir.shard.values import (
    Grid,
    LocalStage,
    Partitioned,
    Propagated,
    Reshard,
    TensorSharding,
)
from apportion.mlir.types import FLOAT_TYPES
from apportion.mlir.types import mlir_type as elt
from apportion.mlir.upstream import verify_upstream
from apportion.schedule.mesh import box_shape


def _module(grid: Grid, blk: Block, name: str, args: Sequence[tuple[str, str]],
            results: Sequence[str], ret: Sequence[str], attrs: str = "") -> str:
    sig = ", ".join(f"{a}: {t}" for a, t in args)
    head = f"func.func @{_sym(name)}({sig}) -> ({', '.join(results)}){attrs} {{"
    lines = [grid_op(grid), *declarations(blk), head, blk.text(),
             f"  return {', '.join(ret)} : {', '.join(results)}" if ret else "  return", "}"]
    text = "\n".join(line for line in lines if line) + "\n"
    verify_upstream(text)
    return text


def _sym(name: str) -> str:
    s = symbol_name(name)
    return s if s.replace("_", "").replace(".", "").isalnum() else f'"{s}"'


def _annotate(blk: Block, value: str, t: TensorType, sharding: TensorSharding,
              users: bool = False) -> str:
    s = blk.fresh(f"s_{t.name}")
    blk.emit(sharding_op(s, sharding))
    out = blk.fresh(t.name)
    blk.emit(f"{out} = shard.shard {value} to {s}{' annotate_for_users' if users else ''} : "
             f"{value_type(t)}")
    return out


def _annotate_typed(blk: Block, value: str, ty: str, t: TensorType, sharding: TensorSharding,
                    users: bool = False) -> str:
    """``_annotate`` of a value of type ``ty`` laid out like tensor ``t`` (an op's destination:
    its accumulator type may differ from the tensor's)."""
    s = blk.fresh(f"s_{t.name}")
    blk.emit(sharding_op(s, sharding))
    out = blk.fresh(f"{t.name}_dest")
    blk.emit(f"{out} = shard.shard {value} to {s}{' annotate_for_users' if users else ''} : "
             f"{ty}")
    return out


def _annotated(program: Program, annotations: Mapping[str, TensorSharding]
               ) -> tuple[Block, list[tuple[str, str]], dict[str, str],
                          dict[str, tuple[str, tuple[str, ...]]]]:
    """The annotated form's function body: its block, arguments, every tensor's value, and
    per op its output's SSA value and the lines of its code."""
    blk = Block()
    vals: dict[str, str] = {}
    args = []
    for name in program.inputs:
        t = program.tensor(name)
        arg = blk.fresh(f"arg_{name}")
        args.append((arg, value_type(t)))
        vals[name] = arg
        if name in annotations:
            vals[name] = _annotate(blk, arg, t, annotations[name])
    ops: dict[str, tuple[str, tuple[str, ...]]] = {}
    for op in program.ops:
        before = len(blk.lines)
        out = render_op(blk, op, program.tensor_map, vals)
        ops[op.name] = (out, tuple(blk.lines[before:]))
        t = program.tensor(op.out.tensor)
        vals[op.out.tensor] = _annotate(blk, out, t, annotations[t.name]) \
            if t.name in annotations else out
    return blk, args, vals, ops


def annotated_mlir(program: Program, grid: Grid, annotations: Mapping[str, TensorSharding]
                   ) -> str:
    """The program with the user's annotations (form 1, each annotated tensor's value through
    ``shard.shard``), verified upstream.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.mlir.shard.values import GridAxis
    >>> text = annotated_mlir(load("examples/mlp.json"), Grid((GridAxis("tp", 2),), "tp=2"),
    ...                       {"x": TensorSharding(((0,), ()), cuts=((0, 128, 256), ()))})
    ...                                                             # doctest: +SKIP
    """
    blk, args, vals, _ = _annotated(program, annotations)
    outs = [value_type(program.tensor(n)) for n in program.outputs]
    return _module(grid, blk, program.name, args, outs, [vals[n] for n in program.outputs],
                   " attributes {apportion.form = \"annotated\"}")


def annotated_ops(program: Program, annotations: Mapping[str, TensorSharding]
                  ) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Per op of ``annotated_mlir``'s form, the SSA value its output is made as and the lines
    of its code: what upstream's propagation of that form is read back by.

    >>> from apportion.frontend.json_format import load
    >>> annotated_ops(load("examples/mlp.json"), {})["gate"][0]
    '%g'
    """
    return _annotated(program, annotations)[3]


def propagated_mlir(p: Propagated) -> str:
    """Every tensor's sharding as the plan chose it (form 2), verified upstream."""
    program = p.program
    blk = Block()
    vals: dict[str, str] = {}
    args = []
    placed = dict(p.inputs)
    for name in program.inputs:
        t = program.tensor(name)
        arg = blk.fresh(f"arg_{name}")
        args.append((arg, value_type(t)))
        vals[name] = _annotate(blk, arg, t, placed[name])
    for op, (ins, result) in zip(program.ops, p.ops, strict=True):
        reads = dict(vals)
        for acc, s in zip(op.ins, ins, strict=True):
            reads[acc.tensor] = _annotate(blk, vals[acc.tensor], program.tensor(acc.tensor), s,
                                          users=True)
        out_t = program.tensor(op.out.tensor)

        def mark(b: Block, value: str, ty: str, t: TensorType = out_t,
                 s: TensorSharding = result,
                 unit: tuple[int, ...] = tuple(j for j, e in enumerate(op.out.index)
                                               if not e.terms)) -> str:
            # a destination is laid out as the op's output, whole (a split reduction's
            # replicated: upstream zeroes it on all but one device), as upstream's
            # propagation annotates it: its result, then for its user; one written without
            # the output's literal (size-1) dims has their shardings dropped
            s = s.without(unit if ty.count("x") < len(t.shape) else ())
            made = _annotate_typed(b, value, ty, t, s)
            return _annotate_typed(b, made, ty, t, s, users=True)

        read_as = {acc.tensor: s for acc, s in zip(op.ins, ins, strict=True)}

        def mark_read(b: Block, value: str, ty: str, tensor: str, unit: tuple[int, ...],
                      read_as: dict[str, TensorSharding] = read_as) -> str:
            s = read_as[tensor].without(unit)
            t = program.tensor(tensor)
            made = _annotate_typed(b, value, ty, t, s)
            return _annotate_typed(b, made, ty, t, s, users=True)

        blk.mark_init, blk.mark_read = mark, mark_read
        out = render_op(blk, op, program.tensor_map, reads)
        blk.mark_init = blk.mark_read = None
        vals[op.out.tensor] = _annotate(blk, out, out_t, result)
    ret = []
    for name, s in p.outputs:
        ret.append(_annotate(blk, vals[name], program.tensor(name), s, users=True))
    outs = [value_type(program.tensor(n)) for n in program.outputs]
    return _module(p.grid, blk, program.name, args, outs, ret,
                   f" attributes {{apportion.form = \"propagated\", apportion.method = "
                   f"\"{p.method}\"}}")


# -- the partitioned (SPMD) form -------------------------------------------------------------


class _Spmd:
    """The SPMD function being written: every local value's SSA name and its type on every
    device (a dim whose devices' sizes differ is ``?``)."""

    def __init__(self, p: Partitioned) -> None:
        self.program, self.grid = p.program, p.grid
        self.devices = math.prod(a.size for a in p.grid.axes)
        self.blk = Block()
        self.vals: dict[str, str] = {}
        self.types: dict[str, tuple[TensorType, ...]] = {}  # per device
        self.linear: str | None = None

    def spmd_type(self, name: str) -> str:
        ts = self.types[name]
        shape = tuple(ts[0].shape[i] if len({t.shape[i] for t in ts}) == 1 else None
                      for i in range(len(ts[0].shape)))
        return tensor_type(shape, elt(ts[0].dtype))

    def lin(self) -> str:
        if self.linear is None:
            self.linear = "%device"
            self.blk.emit(f"{self.linear} = shard.process_linear_index on @mesh : index")
        return self.linear

    # one op's local code on every device ------------------------------------------------

    def local(self, results: Sequence[str], write: list) -> None:
        """Run ``write(blk, device, vals)`` for every device (it renders that device's code
        with static local types and returns {name: (ssa, TensorType)} for ``results``); the
        same code on every device is emitted once, else an ``scf.index_switch``."""
        variants: dict[str, list[int]] = {}
        texts: dict[int, tuple[Block, dict]] = {}
        for d in range(self.devices):
            b = Block(indent=0, taken=dict(self.blk.taken),
                      declarations=dict(self.blk.declarations), used=set(self.blk.used))
            outs = write(b, d)
            key = b.text() + repr(sorted((k, v[0], v[1].shape) for k, v in outs.items()))
            variants.setdefault(key, []).append(d)
            texts[d] = (b, outs)
        if len(variants) == 1:
            b, outs = texts[0]
            for line in b.lines:
                self.blk.emit(line)
            self.blk.taken, self.blk.declarations, self.blk.used = \
                b.taken, b.declarations, b.used
            for name in results:
                self.vals[name] = outs[name][0]
                self.types[name] = tuple(texts[d][1][name][1] for d in range(self.devices))
            return
        for name in results:
            self.types[name] = tuple(texts[d][1][name][1] for d in range(self.devices))
        lin = self.lin()
        rtypes = [self.spmd_type(n) for n in results]
        names = [self.blk.fresh(n) for n in results]
        lhs = names[0] if len(names) == 1 else f"{names[0]}:{len(names)}"
        groups = sorted(variants.values(), key=len)
        default = groups[-1]
        self.blk.emit(f"{lhs} = scf.index_switch {lin} -> {', '.join(rtypes)}")
        for g in [*[[d] for grp in groups[:-1] for d in grp], default]:
            d = g[0]
            b, outs = texts[d]
            self.blk.emit(f"case {d} {{" if g is not default else "default {")
            self.blk.indent += 1
            for line in b.lines:
                self.blk.emit(line)
            yields = []
            for n, rt in zip(results, rtypes, strict=True):
                ssa, t = outs[n]
                if value_type(t) != rt:
                    c = self.blk.fresh(f"{n}_spmd")
                    self.blk.emit(f"{c} = tensor.cast {ssa} : {value_type(t)} to {rt}")
                    ssa = c
                yields.append(ssa)
            self.blk.emit(f"scf.yield {', '.join(yields)} : {', '.join(rtypes)}")
            self.blk.indent -= 1
            self.blk.emit("}")
            for k, v in b.taken.items():  # names stay unique across cases
                self.blk.taken[k] = max(self.blk.taken.get(k, 0), v)
            self.blk.declarations.update(b.declarations)
            self.blk.used |= b.used
        for n, ssa in zip(results, names, strict=True):
            self.vals[n] = ssa if len(names) == 1 else f"{names[0]}#{results.index(n)}"

    def operand(self, b: Block, name: str, d: int) -> str:
        """The value ``name`` in device ``d``'s code, cast to its static local type."""
        t = self.types[name][d]
        if self.spmd_type(name) == value_type(t):
            return self.vals[name]
        c = b.fresh(f"{name}_local")
        b.emit(f"{c} = tensor.cast {self.vals[name]} : {self.spmd_type(name)} to {value_type(t)}")
        return c

    def op(self, stage: LocalStage) -> None:
        out = stage.result

        def write(b: Block, d: int) -> dict:
            code = stage.devices[d]
            types = {t.name: t for t in code.types}
            vals = {r: self.operand(b, r, d) for r in stage.reads}
            for lop in code.ops:
                vals[lop.out.tensor] = render_op(b, lop, types, vals)
            if code.finish is not None:
                vals[out] = finish_op(b, code.finish, types, vals)
            return {out: (vals[out], types[out])}

        self.local([out], write)

    # the collectives -------------------------------------------------------------------------

    def step(self, r: Reshard) -> None:
        """One resharding step of ``tensor``'s value ``src`` into the new value ``result``."""
        step = r.step
        tensor, src, result = step.tensor, step.source, step.result
        axis = self.grid.index(step.axes[0])
        self.types[result] = tuple(TensorType(result, box_shape(b), step.out_dtype)
                                   for b in step.dst_boxes)
        before, after = self.spmd_type(src), self.spmd_type(result)
        if step.kind == "peer_read":
            raise EmitError(
                f"tensor {tensor!r} dim {step.dim}: its reader reads it in place from its peers' "
                f"memory along peered axis {step.axes[0]!r} (a peer_read from {r.between[0]} to "
                f"{r.between[1]}: no copy is made), which nothing in upstream MLIR 22's shard "
                "dialect says (every op of it that moves data, the collectives, send/recv, "
                "shift and update_halo, yields a new value on the receiving device); the "
                "unrolled form (--shard-form unrolled) moves it by its boxes")
        if step.kind == "halo":
            self._halo(r)
            return
        if step.kind != "all_reduce" and any(
                len(set(self._lens(tensor, boxes, i))) > 1
                for i in {step.dim, step.to_dim} - {None}
                for boxes in (step.src_boxes, step.dst_boxes)):
            self._uneven(r)
            return
        v = self.vals[src]
        res = self.blk.fresh(result)
        remote = " {apportion.remote}" if r.remote else ""
        kind = step.kind
        held_after = self.types[result][0].dtype
        if kind in ("all_reduce", "reduce_scatter"):
            red = REDUCER_OPS[step.reducer or "sum"].shard
            after_held = tensor_type(self._shape(result), elt(self.types[src][0].dtype))
            scatter = f" scatter_axis = {step.dim}" if kind == "reduce_scatter" else ""
            self.blk.emit(f"{res} = shard.{kind} {v} on @mesh grid_axes = [{axis}] reduction = "
                          f"{red}{scatter}{remote} : {before} -> {after_held}")
            self.vals[result] = self._after_reduce(res, result, step.unpack, after_held,
                                                   self.types[src][0].dtype, held_after)
            return
        if kind == "all_gather":
            what = f"gather_axis = {step.dim}"
        elif kind == "slice":
            kind, what = "all_slice", f"slice_axis = {step.dim}"
        elif kind == "all_to_all":
            what = f"split_axis = {step.to_dim} concat_axis = {step.dim}"
        else:
            raise EmitError(f"tensor {tensor!r}: resharding step {step} has no shard-dialect "
                            "collective in upstream MLIR 22")
        self.blk.emit(f"{res} = shard.{kind} {v} on @mesh grid_axes = [{axis}] {what}{remote} "
                      f": {before} -> {after}")
        self.vals[result] = res

    def _halo(self, r: Reshard) -> None:
        """A ``halo`` step as upstream's ``shard.update_halo``: each device puts its shard into
        a tensor grown by upstream's one (low, high) pair along the dim (``Reshard.halo``; the
        pair is the same on every device, an outermost shard's halo beyond the tensor stays
        zero and is never read), the update fills the halo rows from the adjacent shards, and
        each device reads its window out of it at its own offset (a device with no
        neighbour below reads ``low`` rows further in)."""
        step = r.step
        src, result = step.source, step.result
        j, axis = step.dim, step.axes[0]
        assert j is not None  # a halo step names its dim
        if r.halo is None:
            raise EmitError(r.refusal or f"{step}: no halo pair")
        low, high = r.halo
        held = self.types[src][0].dtype
        e = elt(held)
        grown = f"{result}.halo"
        src_boxes, dst_boxes = step.src_boxes, step.dst_boxes

        def write_grown(b: Block, d: int) -> dict:
            t = self.types[src][d]
            out = tuple(n + low + high if i == j else n for i, n in enumerate(t.shape))
            at = [low if i == j else 0 for i in range(len(out))]
            acc = _insert(b, self.operand(b, src, d), t.shape, _zeros(b, grown, out, e), out,
                          at, e)
            return {grown: (acc, TensorType(grown, out, held))}

        self.local([grown], write_grown)
        updated = f"{result}.updated"
        self.types[updated] = tuple(TensorType(updated, t.shape, t.dtype)
                                    for t in self.types[grown])
        res = self.blk.fresh(updated)
        axes = ", ".join(f"[{self.grid.index(axis)}]" if i == j else "[]"
                         for i in range(len(self.program.tensor(step.tensor).shape)))
        remote = " {apportion.remote}" if r.remote else ""
        self.blk.emit(f"{res} = shard.update_halo {self.vals[grown]} on @mesh split_axes = "
                      f"[{axes}] halo_sizes = [{low}, {high}]{remote} : "
                      f"{self.spmd_type(grown)}")
        self.vals[updated] = res

        def write_window(b: Block, d: int) -> dict:
            t = self.types[updated][d]
            want = tuple(hi - lo for lo, hi in dst_boxes[d])
            offs = [0] * len(want)
            # the window's first row within the grown shard, whose row ``low`` is the shard's
            offs[j] = dst_boxes[d][j][0] - src_boxes[d][j][0] + low
            piece = _extract(b, self.operand(b, updated, d), t.shape, offs, want, e)
            return {result: (piece, TensorType(result, want, held))}

        self.local([result], write_window)

    @staticmethod
    def _lens(tensor: str, boxes: Sequence[tuple[tuple[int, int], ...]], i: int) -> list[int]:
        return [b[i][1] - b[i][0] for b in boxes]

    def _uneven(self, reshard: Reshard) -> None:
        """A step over uneven shards, with upstream's collectives on even ones: each device
        pads its shard into equal slots (a dim gathered: its piece padded to the largest
        piece; a dim cut: every piece moved to a slot of the largest piece's size), the
        collective moves the slots, and each device keeps the rows of its own pieces."""
        step = reshard.step
        tensor, src, result = step.tensor, step.source, step.result
        kind, axis = step.kind, step.axes[0]
        k = len(step.group(0))
        concat = step.dim if kind in ("all_gather", "all_to_all") else None
        split = step.to_dim if kind == "all_to_all" else \
            step.dim if kind in ("slice", "reduce_scatter") else None
        sb, db = step.src_boxes, step.dst_boxes
        m_c = max(self._lens(tensor, sb, concat)) if concat is not None else 0
        m_s = max(self._lens(tensor, db, split)) if split is not None else 0
        held = self.types[src][0].dtype
        e = elt(held)

        def group(d: int) -> tuple[int, ...]:  # the devices along the axis, in rank order
            return step.group(d)

        def padded_shape(d: int) -> tuple[int, ...]:
            shape = list(self.types[src][d].shape)
            if concat is not None:
                shape[concat] = m_c
            if split is not None:
                shape[split] = k * m_s
            return tuple(shape)

        pre = f"{result}.slots"

        def write_pre(b: Block, d: int) -> dict:
            v = self.operand(b, src, d)
            t = self.types[src][d]
            out_shape = padded_shape(d)
            acc = _zeros(b, pre, out_shape, e)
            if split is None:
                acc = _insert(b, v, t.shape, acc, out_shape, [0] * len(out_shape), e)
            else:
                for r, p in enumerate(group(d)):  # piece r of the cut dim into slot r
                    lo = db[p][split][0] - sb[d][split][0]
                    n = db[p][split][1] - db[p][split][0]
                    offs = [0] * len(t.shape)
                    offs[split] = lo
                    size = list(t.shape)
                    size[split] = n
                    piece = _extract(b, v, t.shape, offs, size, e)
                    at = [0] * len(t.shape)
                    at[split] = r * m_s
                    acc = _insert(b, piece, size, acc, out_shape, at, e)
            return {pre: (acc, TensorType(pre, out_shape, held))}

        self.local([pre], write_pre)
        moved = f"{result}.moved"
        self.types[moved] = tuple(
            TensorType(moved, tuple(k * m_c if i == concat else m_s if i == split else n
                                    for i, n in enumerate(padded_shape(d))), held)
            for d in range(self.devices))
        grid_axis = self.grid.index(axis)
        remote = " {apportion.remote}" if reshard.remote else ""
        res = self.blk.fresh(moved)
        if kind == "all_gather":
            what = f"all_gather {self.vals[pre]} on @mesh grid_axes = [{grid_axis}] " \
                   f"gather_axis = {concat}"
        elif kind == "slice":
            what = f"all_slice {self.vals[pre]} on @mesh grid_axes = [{grid_axis}] " \
                   f"slice_axis = {split}"
        elif kind == "all_to_all":
            what = f"all_to_all {self.vals[pre]} on @mesh grid_axes = [{grid_axis}] " \
                   f"split_axis = {split} concat_axis = {concat}"
        else:
            red = REDUCER_OPS[step.reducer or "sum"].shard
            what = f"reduce_scatter {self.vals[pre]} on @mesh grid_axes = [{grid_axis}] " \
                   f"reduction = {red} scatter_axis = {split}"
        self.blk.emit(f"{res} = shard.{what}{remote} : {self.spmd_type(pre)} -> "
                      f"{self.spmd_type(moved)}")
        self.vals[moved] = res
        kept = result if kind != "reduce_scatter" else f"{result}.kept"

        def write_post(b: Block, d: int) -> dict:
            w = self.operand(b, moved, d)
            mt = self.types[moved][d]
            out_shape = tuple(hi - lo for lo, hi in db[d])
            acc = _zeros(b, kept, out_shape, e)
            pieces = list(enumerate(group(d))) if concat is not None else [(0, d)]
            for r, p in pieces:
                offs = [0] * len(out_shape)
                size = list(out_shape)
                at = [0] * len(out_shape)
                if concat is not None:
                    offs[concat] = r * m_c
                    size[concat] = sb[p][concat][1] - sb[p][concat][0]
                    at[concat] = sb[p][concat][0] - db[d][concat][0]
                piece = _extract(b, w, mt.shape, offs, size, e)
                acc = _insert(b, piece, size, acc, out_shape, at, e)
            return {kept: (acc, TensorType(kept, out_shape, held))}

        self.local([kept], write_post)
        if kind == "reduce_scatter":
            self.vals[result] = self._after_reduce(
                self.vals[kept], result, step.unpack, self.spmd_type(kept), held,
                self.types[result][0].dtype)
        else:
            self.vals[result] = self.vals[kept]

    def _shape(self, name: str) -> tuple[int | None, ...]:
        ts = self.types[name]
        return tuple(ts[0].shape[i] if len({t.shape[i] for t in ts}) == 1 else None
                     for i in range(len(ts[0].shape)))

    def _after_reduce(self, res: str, result: str, unpack: bool, held: str, src_dtype: str,
                      dst_dtype: str) -> str:
        """A reduction's total cast to the dtype the devices hold next (a float16 sum's float32
        partials become float16 once whole), an argmax's keys unpacked to the index once no
        axis is pending (``unpack``)."""
        if src_dtype == dst_dtype and not unpack:
            return res
        shape = self._shape(result)
        rank = len(shape)
        ident = identity_map(rank)
        src_e, dst_e = elt(src_dtype), elt(dst_dtype)
        dyn = []
        for i, n in enumerate(shape):  # a size the devices differ in: the reduced value's
            if n is None:
                c = self.blk.const(i, "index")
                size = self.blk.fresh(f"{result}_size")
                self.blk.emit(f"{size} = tensor.dim {res}, {c} : {held}")
                dyn.append(size)
        init = self.blk.fresh(f"{result}_init")
        self.blk.emit(f"{init} = tensor.empty({', '.join(dyn)}) : {tensor_type(shape, dst_e)}")

        body = cast_body(unpack, src_e, dst_e)

        return generic(self.blk, [f"p{i}" for i in range(rank)], (),
                       [(res, held, src_e, ident)],
                       [(init, tensor_type(shape, dst_e), dst_e, ident)], body,
                       f"{result}_whole")[0]


def _zeros(b: Block, stem: str, shape: Sequence[int], e: str) -> str:
    init = b.fresh(f"{stem}_init")
    ty = tensor_type(shape, e)
    b.emit(f"{init} = tensor.empty() : {ty}")
    c = b.const(0.0 if e in FLOAT_TYPES else 0, e)
    out = b.fresh(stem)
    b.emit(f"{out} = linalg.fill ins({c} : {e}) outs({init} : {ty}) -> {ty}")
    return out


def _extract(b: Block, v: str, shape: Sequence[int], offs: Sequence[int], size: Sequence[int],
             e: str) -> str:
    if list(offs) == [0] * len(shape) and list(size) == list(shape):
        return v
    out = b.fresh("piece")
    b.emit(f"{out} = tensor.extract_slice {v}[{', '.join(map(str, offs))}] "
           f"[{', '.join(map(str, size))}] [{', '.join('1' for _ in shape)}] : "
           f"{tensor_type(shape, e)} to {tensor_type(size, e)}")
    return out


def _insert(b: Block, piece: str, size: Sequence[int], acc: str, shape: Sequence[int],
            at: Sequence[int], e: str) -> str:
    out = b.fresh("placed")
    b.emit(f"{out} = tensor.insert_slice {piece} into {acc}[{', '.join(map(str, at))}] "
           f"[{', '.join(map(str, size))}] [{', '.join('1' for _ in shape)}] : "
           f"{tensor_type(size, e)} into {tensor_type(shape, e)}")
    return out


def partitioned_mlir(p: Partitioned) -> str:
    """The SPMD form every device runs (form 3), verified upstream."""
    sp = _Spmd(p)
    args = []
    for name, types in p.inputs:
        sp.types[name] = types
        arg = sp.blk.fresh(f"arg_{name}")
        sp.vals[name] = arg
        args.append((arg, sp.spmd_type(name)))
    for stage in p.stages:
        if isinstance(stage, Reshard):
            sp.step(stage)
        else:
            sp.op(stage)
    ret = [sp.vals[local] for local in p.outputs]
    outs = [sp.spmd_type(local) for local in p.outputs]
    return _module(p.grid, sp.blk, p.program.name, args, outs, ret,
                   " attributes {apportion.form = \"partitioned\"}")
