"""The LoopSpec program of a plan: nested counted loops of kernel launches with their tensors.

Ops outside loops are bare OpSpecs in program order; the ops of a tiling group nest in LoopSpecs
as their loop paths say (``plans.tiles.loop_tree``: an op at a lesser depth sits next to the
inner LoopSpec of its neighbours, an op with a loop of its own gets its own LoopSpec), with the
steps the loops need:

* before the level that tiles an op's reduction dim, an init (``<op>.init``, op ``fill``)
  setting its slice of the accumulator to the reduction's identity;
* the combine of an accumulating op is folded into its own launch: it reads its accumulator
  tile as one more input, after its own, and writes the combined tile back (no partial buffer
  exists to combine from);
* after an op whose tile is also read after the loop, a copy (``<op>.copy``, op ``copy``) of
  its tile buffer into its slice of the full tensor;
* after the nest, for an accumulator wider than its tensor (float32 partial sums of a float16
  result) or a mean, a finish (``<op>.finish``, op ``finish_<fn>``) reading the accumulator
  and writing the full tensor (cast, and for a mean divided by the op's reduction extent).

Accumulators carry their own dtype (``TensorArg.dtype`` float32) and device layout.

An output written through a merge of dims (``y[t, 64*h+d]``) is addressed through the merge as
an input's sum index is: device coordinates ``(h * 64 + d) floordiv 64`` and ``... mod 64``,
a tile stride of 64 elements per step of ``h``. One core's part of a scratchpad tile along a
merged axis split over cores has no layout: a launch that moves within it raises ``EmitError``.

Within a loop, a tensor's per-tile buffer of that group wins; otherwise the launch addresses the
whole tensor and its tile's address moves with the loops (``TensorArg.tile_strides``). A tile
buffer living in fewer loops than the launch (an outer op's tile read in an inner loop, an inner
op's tiles gathered for an outer one) moves within the buffer along the deeper loops.

>>> import apportion as ap
>>> planned = ap.plan(ap.load("examples/fused.json"), target=ap.targets.spyre(cores=32))
>>> print(planned.loopspec())   # doctest: +NORMALIZE_WHITESPACE
LoopSpec(count=2, body=[LoopSpec(count=4, body=[OpSpec(add: m 512/32, n 1024/1;
    a hbm:0, b hbm:8388608 -> y lx:0), OpSpec(mul: m 512/32, n 1024/1;
    y lx:0, c hbm:16777216 -> z hbm:25165824)])])
"""

from __future__ import annotations

from apportion.backends.bundle.addressing import (
    device_coordinates,
    level_steps,
    padded_strides,
    tile_strides,
)
from apportion.backends.bundle.spec_text import from_json as from_json
from apportion.backends.bundle.spec_text import from_source as from_source
from apportion.backends.bundle.spec_text import to_json as to_json
from apportion.backends.bundle.spec_text import to_source as to_source
from apportion.backends.bundle.specs import LoopSpec as LoopSpec
from apportion.backends.bundle.specs import OpSpec as OpSpec
from apportion.backends.bundle.specs import Spec as Spec
from apportion.backends.bundle.specs import SpecProgram as SpecProgram
from apportion.backends.bundle.specs import TensorArg as TensorArg
from apportion.backends.limits import cite
from apportion.errors import EmitError
from apportion.ir.op import Access, Op
from apportion.ir.program import Program
from apportion.plans.memory import Buffer, FinishOp, GroupPlan
from apportion.plans.plan import LoopInfo, OpPlan, Plan
from apportion.plans.tiles import Loop, loop_tree
from apportion.target.layout import device_layout
from apportion.target.target import Target


def loopspec(program: Program, plan: Plan, target: Target) -> SpecProgram:
    """The LoopSpec program of ``plan`` (see the module docstring)."""
    out: list[Spec] = []
    done: set[tuple[int, ...]] = set()
    for op in program.ops:
        op_plan = plan.op(op.name)
        if op_plan.loop is None:
            out.append(_op_spec(program, plan, target, op, op_plan, None))
        elif op_plan.loop.group[:1] not in done:  # the group's ops may sit in several loops
            done.add(op_plan.loop.group[:1])
            out += _nest(program, plan, target, plan.group(op_plan.loop.group))
    return SpecProgram(out)


def _finish_spec(program: Program, plan: Plan, target: Target, fin: FinishOp) -> OpSpec:
    """At the end of the loop tiling the op's reduction (``fin.level``; level 0: after the
    nest): its accumulator, cast (and for a mean scaled), copied out into the tensor's full
    buffer and its tile buffer, whichever it has."""
    op, op_plan = program.op(fin.op), plan.op(fin.op)
    loop = op_plan.loop
    assert loop is not None
    depth = fin.level
    planned = {n: v for n, _lo, _hi, v in plan.group(loop.group).symbolic}
    sizes = _sizes_at(op, op_plan, loop, depth, planned)
    space = {d: (sizes[d], op_plan.split_map[d]) for d in op.out.dims}
    kinds = {b.kind for b in plan.buffers_of(op.out.tensor)}
    args = [_arg(program, plan, target, op, op.out, 0, True, loop, depth, prefer="accumulator")]
    for kind in ("full", "tile"):
        if kind in kinds:
            args.append(_arg(program, plan, target, op, op.out, len(args), False, loop, depth,
                             prefer=kind))
    tiled = _tiled(LoopInfo(loop.group[:depth], loop.count[:depth], loop.tiled_dims[:depth]))
    return OpSpec(f"finish_{fin.fn}", False, space, tuple(args),
                  tuple(d for d in tiled if d in op.out.dims), f"{op.name}.finish")


def _nest(program: Program, plan: Plan, target: Target, group: GroupPlan) -> list[Spec]:
    """The loops of one group as its ops' loop paths nest them (``plans.tiles.loop_tree``),
    with inits in front of the loop that tiles their reduction and finishes after it."""
    loops = {n: plan.op(n).loop for n in group.ops}
    tree = loop_tree(group.ops, loops)  # type: ignore[arg-type]
    return _items(program, plan, target, group, tree)


def _items(program: Program, plan: Plan, target: Target, group: GroupPlan,
           items: list[str | Loop]) -> list[Spec]:
    out: list[Spec] = []
    for item in items:
        if isinstance(item, str):
            op, op_plan = program.op(item), plan.op(item)
            accumulates = any(c.op == item for c in group.combines)
            out.append(_op_spec(program, plan, target, op, op_plan, op_plan.loop, accumulates))
            for c in group.copies:
                if c.op == item:
                    assert op_plan.loop is not None
                    out.append(_step_spec(program, plan, target, op, op_plan, "copy", "copy",
                                          len(op_plan.loop.count)))
            continue
        inside = set(item.names())
        # an init runs before the loop tiling the reduction, over what the outer loops select
        out += [_step_spec(program, plan, target, program.op(i.op), plan.op(i.op), "init",
                           "fill", item.depth)
                for i in group.inits if i.level == item.depth and i.op in inside]
        out.append(LoopSpec(item.count, tuple(_items(program, plan, target, group,
                                                     item.items))))
        out += [_finish_spec(program, plan, target, f)
                for f in group.finishes if f.level == item.depth and f.op in inside]
    return out


def _op_spec(program: Program, plan: Plan, target: Target, op: Op, op_plan: OpPlan,
             loop: LoopInfo | None, accumulates: bool = False) -> OpSpec:
    depth = len(loop.count) if loop else 0
    reads = (*op.ins, op.out) if accumulates else op.ins
    acc = "accumulator" if accumulates else None
    args = [_arg(program, plan, target, op, a, i, True, loop, depth,
                 prefer=acc if a is op.out else None) for i, a in enumerate(reads)]
    args.append(_arg(program, plan, target, op, op.out, len(reads), False, loop, depth,
                     prefer=acc))
    space = {d: (n, op_plan.split_map[d]) for d, n in op_plan.iteration_space}
    return OpSpec(op.fn, bool(op.reduction_dims), space, tuple(args), _tiled(loop), op.name)


def _step_spec(program: Program, plan: Plan, target: Target, op: Op, op_plan: OpPlan,
               step: str, fn: str, depth: int) -> OpSpec:
    """An init or a copy over the op's output: one launch over the output's dims."""
    loop = op_plan.loop
    assert loop is not None
    out = op.out
    dims = out.dims
    planned = {n: v for n, _lo, _hi, v in plan.group(loop.group).symbolic}
    sizes = _sizes_at(op, op_plan, loop, depth, planned)
    space = {d: (sizes[d], op_plan.split_map[d]) for d in dims}
    if step == "copy":
        src = _arg(program, plan, target, op, out, 0, True, loop, depth, prefer="tile")
        dst = _arg(program, plan, target, op, out, 1, False, loop, depth, prefer="full")
        args: tuple[TensorArg, ...] = (src, dst)
    else:
        args = (_arg(program, plan, target, op, out, 0, False, loop, depth,
                     prefer="accumulator"),)
    tiled = _tiled(LoopInfo(loop.group[:depth], loop.count[:depth], loop.tiled_dims[:depth]))
    return OpSpec(fn, False, space, args, tuple(d for d in tiled if d in dims),
                  f"{op.name}.{step}")


def _sizes_at(op: Op, op_plan: OpPlan, loop: LoopInfo, depth: int,
              planned: dict[str, int] | None = None) -> dict[str, int]:
    """Per-launch sizes of the op's dims inside the outer ``depth`` levels (a symbolic count
    at the value its tiles were planned at, ``planned``: an upper bound of its tiles)."""
    if depth == len(loop.count):
        return op_plan.sizes
    sizes = dict(op.sizes)
    for count, dims in zip(loop.count[:depth], loop.tiled_dims[:depth], strict=True):
        n = count if isinstance(count, int) else (planned or {}).get(count, 1)
        for d in dims:
            sizes[d] //= n
    return sizes


def _tiled(loop: LoopInfo | None) -> tuple[str, ...]:
    out: list[str] = []
    for dims in loop.tiled_dims if loop else ():
        out += [d for d in dims if d not in out]
    return tuple(out)


def _buffer(plan: Plan, tensor: str, loop: LoopInfo | None, prefer: str | None) -> Buffer:
    """The buffer a launch at ``loop`` reaches ``tensor`` through.

    Inside a group its own tile buffer wins, then the accumulator of that group; outside, the
    full buffer (an accumulator only where the tensor has no full one). ``prefer`` names the
    kind a step needs.
    """
    found = plan.buffers_of(tensor)
    if not found:
        raise EmitError(f"the plan places no buffer for tensor {tensor!r}; plan it with the "
                        "buffers and scratchpad passes")
    group = loop.group if loop else None
    # a tile buffer lives in the outer loops of the launch (its group path is a prefix)
    tiles = [b for b in found if b.kind == "tile" and group is not None
             and b.group == group[:len(b.group)]]
    whole = [b for b in found if b.kind != "tile"]
    if tiles and prefer in (None, "tile"):
        return tiles[0]
    if not whole:
        raise EmitError(f"tensor {tensor!r} has only tile buffers "
                        f"({[list(b.group) for b in found]}); nothing holds it whole")
    want = prefer or ("accumulator" if any(b.kind == "accumulator" and b.group == group
                                           for b in whole) else "full")
    return next((b for b in whole if b.kind == want), whole[0])


def _arg(program: Program, plan: Plan, target: Target, op: Op, access: Access, index: int,
         is_input: bool, loop: LoopInfo | None, depth: int, prefer: str | None = None
         ) -> TensorArg:
    t = program.tensor(access.tensor)
    buf = _buffer(plan, t.name, loop, prefer)
    dtype = buf.dtype or t.dtype
    fixed = buf.per_tile_fixed
    if buf.kind == "tile" or buf.kind == "accumulator" and (
            buf.space == "lx" or buf.shape != t.shape):
        # a tile, or a tile-sized accumulator (of the loops outside its reduction's)
        shape, strides = buf.shape, (0,) * depth
        lives = len(buf.group) if buf.kind == "tile" else next(
            i.level for g in plan.groups for i in g.inits if i.tensor == t.name)
        if loop is not None and depth > lives:
            # the launch sits in loops deeper than the buffer: its tile moves within the
            # buffer (one core's part of it, in the scratchpad)
            inner = LoopInfo(loop.group[:depth], loop.count[:depth], loop.tiled_dims[:depth])
            held = _per_core(plan, program, t.name, shape) if buf.space == "lx" else shape
            moves = tile_strides(access, padded_strides(held, dtype, target),
                                 level_steps(inner, op.sizes))
            strides = (0,) * lives + moves[lives:]
        fixed = not any(strides)
    else:
        shape = t.shape
        strides = (0,) * depth
        if loop is not None and depth:
            inner = LoopInfo(loop.group[:depth], loop.count[:depth], loop.tiled_dims[:depth])
            strides = tile_strides(access, padded_strides(shape, dtype, target),
                                   level_steps(inner, op.sizes))
    return TensorArg(
        is_input=is_input, arg_index=index, dtype=dtype,
        device_size=device_layout(shape, dtype, target).shape,
        device_coordinates=device_coordinates(access, shape, dtype, target),
        allocation={buf.space: buf.offset}, per_tile_fixed=fixed,
        tensor=t.name, tile_strides=strides)


def _per_core(plan: Plan, program: Program, tensor: str, shape: tuple[int, ...]
              ) -> tuple[int, ...]:
    """The extents of one core's part of a scratchpad tile (its producer's largest slice)."""
    producer = program.producer(tensor)
    if producer is None:
        return shape
    op_plan = plan.op(producer.name)
    per, splits = dict(op_plan.unit_elems), op_plan.split_map
    out = []
    for e, n in zip(producer.out.index, shape, strict=True):
        d = e.single_dim
        if d is None and any(splits.get(x, 1) > 1 for x in e.dims):
            raise EmitError(
                f"op {producer.name!r} writes tensor {tensor!r} through the merge "
                f"{e.to_source()} split over cores, and its scratchpad tile is read in loops "
                "deeper than the tile: one core's part of a merged axis has no scratchpad layout "
                "(ops that write through a merge run outside loop nests) "
                f"{cite('bundle-merged-scratchpad-tile')}")
        if d is None or splits.get(d, 1) == 1:
            out.append(n)
        else:
            units = -(-n // per[d])
            out.append(min(n, -(-units // splits[d]) * per[d]))
    return tuple(out)
