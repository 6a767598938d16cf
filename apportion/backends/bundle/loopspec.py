"""The LoopSpec program of a plan: nested counted loops of kernel launches with their tensors.

Built from the plan's schedule (``schedule.lower``, the one lowered form), nothing else: every
launch's tile, its workers' splits and how its tile moves per loop level are the schedule's,
with a symbolic loop count kept symbolic (the schedule is lowered at the values the counts were
planned at, ``lower.planned_counts``, and each step recovered over its count,
``values.symbolic_steps``). The plan's buffers are the schedule's; what is the bundle's own is
the addressing (``addressing``: device layouts, byte strides, device coordinates).

Ops outside loops are bare OpSpecs in program order; the ops of a tiling group nest in LoopSpecs
as the schedule's ``Loop``s do (an op at a lesser depth sits next to the inner LoopSpec of its
neighbours, an op with a loop of its own gets its own LoopSpec), with the steps the loops need:

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

Within a loop, a tensor's per-tile buffer of the launch's loops (``Loop.path``) wins; otherwise
the launch addresses the whole tensor and its tile's address moves with the loops
(``TensorArg.tile_strides``). A tile buffer living in fewer loops than the launch (an outer op's
tile read in an inner loop, an inner op's tiles gathered for an outer one) moves within the
buffer along the deeper loops; in the scratchpad within one core's part of it, as the
producer's workers cut it (``Launch.part``).

>>> import apportion as ap
>>> planned = ap.plan(ap.load("examples/fused.json"), target=ap.targets.spyre(cores=32))
>>> print(planned.loopspec())   # doctest: +NORMALIZE_WHITESPACE
LoopSpec(count=2, body=[LoopSpec(count=4, body=[OpSpec(add: m 512/32, n 1024/1;
    a hbm:0, b hbm:8388608 -> y lx:0), OpSpec(mul: m 512/32, n 1024/1;
    y lx:0, c hbm:16777216 -> z hbm:25165824)])])
"""

from __future__ import annotations

from dataclasses import dataclass

from apportion.backends.bundle.addressing import (
    SymbolicStep,
    device_coordinates,
    padded_strides,
    tile_strides,
)
from apportion.errors import EmitError
from apportion.ir.op import Access, Op
from apportion.limits import cite
from apportion.mlir.bundle import render_bundle
from apportion.plans.memory import Buffer
from apportion.schedule.loopspec_values import LoopSpec, OpSpec, Spec, SpecProgram, TensorArg
from apportion.schedule.values import (
    Copy,
    Finish,
    Host,
    Init,
    Launch,
    Loop,
    Ranges,
    Schedule,
    Step,
    Steps,
    outer_tile,
    symbolic_steps,
)
from apportion.target.layout import device_layout
from apportion.target.target import Target


def from_schedule(schedule: Schedule, target: Target) -> SpecProgram:
    """The LoopSpec program of ``schedule`` on ``target`` (whose layouts address the tensors;
    see the module docstring): a plan's schedule lowered at the values its symbolic loop
    counts were planned at (``PlannedProgram.lowered``), which stay symbolic in the loops.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
    >>> specs = from_schedule(planned.lowered, planned.target)
    >>> specs[0]   # doctest: +NORMALIZE_WHITESPACE
    OpSpec(gate=matmul: m 256/2, n 2816/4, k 1024/1; x hbm:0, wg hbm:524288 -> g hbm:17825792)
    """
    return SpecProgram(_Builder(schedule, target).items(schedule.steps, ()))


@dataclass(frozen=True)
class _Site:
    """Where an op runs in the schedule: its tile at iteration 0 of its loops (its dims in
    order), the tile's step per loop level, the loops, and its workers' splits per dim."""

    op: Op
    tile: Ranges
    steps: Steps
    loops: tuple[Loop, ...]
    splits: dict[str, int]
    launch: Launch | None

    @property
    def depth(self) -> int:
        return len(self.loops)

    @property
    def path(self) -> tuple[int, ...] | None:
        """The op's loop path (None outside loops): its buffers' groups are prefixes of it."""
        return self.loops[-1].path if self.loops else None

    def sizes_at(self, depth: int) -> dict[str, int]:
        """Per-launch sizes of the op's dims inside its ``depth`` outer loops."""
        whole = tuple((0, n) for _, n in self.op.dims)
        tile, _ = outer_tile(self.tile, self.steps, whole, depth)
        return {d: hi - lo for d, (lo, hi) in zip(self.op.dim_names, tile, strict=True)}

    def tiled(self, depth: int) -> tuple[str, ...]:
        """The dims the ``depth`` outer loops tile, outermost first."""
        out: list[str] = []
        for step in self.steps[:depth]:
            out += [d for d, s in zip(self.op.dim_names, step, strict=True) if s and d not in out]
        return tuple(out)

    def level_steps(self, depth: int) -> list[dict[str, SymbolicStep]]:
        """Per outer loop level (``depth`` of them), the elements one iteration moves along
        each dim it tiles, symbolic counts kept symbolic."""
        steps = symbolic_steps(self.steps[:depth], self.loops[:depth])
        return [{d: s for d, s in zip(self.op.dim_names, level, strict=True) if s[0]}
                for level in steps]


class _Builder:
    """One schedule's specs: where each op runs, and the level each accumulator lives at."""

    def __init__(self, schedule: Schedule, target: Target) -> None:
        self.program, self.target = schedule.program, target
        self.placed: dict[str, tuple[Launch | Host, tuple[Loop, ...]]] = {}
        self.lives: dict[str, int] = {}  # accumulated tensor -> the depth of its Init
        for step, loops in schedule.walk():
            if isinstance(step, Launch | Host):
                self.placed.setdefault(step.op, (step, loops))
            elif isinstance(step, Init):
                self.lives.setdefault(step.tensor, len(loops))
        self.buffers: dict[str, list[Buffer]] = {}
        for b in schedule.buffers:
            self.buffers.setdefault(b.tensor, []).append(b)

    def site(self, name: str) -> _Site:
        step, loops = self.placed[name]
        op = self.program.op(name)
        if isinstance(step, Launch):
            splits = {d: 1 for d in step.dims} | {a.name: a.size for a in step.axes}
            return _Site(op, step.tile, step.steps, loops, splits, step)
        whole = tuple((0, n) for _, n in op.dims)  # a host step: one worker
        return _Site(op, step.tile or whole, step.steps, loops, dict.fromkeys(op.dim_names, 1),
                     None)

    def items(self, steps: tuple[Step, ...], loops: tuple[Loop, ...]) -> list[Spec]:
        out: list[Spec] = []
        for s in steps:
            if isinstance(s, Loop):
                out.append(LoopSpec(s.symbol or s.count, tuple(self.items(s.body, (*loops, s)))))
            elif isinstance(s, Launch | Host):
                out.append(self.op_spec(s))
            elif isinstance(s, Copy):
                out.append(self.step_spec(s.op, "copy", "copy", self.site(s.op).depth))
            elif isinstance(s, Init):
                out.append(self.step_spec(s.op, "init", "fill", len(loops)))
            else:
                out.append(self.finish_spec(s, len(loops)))
        return out

    def op_spec(self, step: Launch | Host) -> OpSpec:
        site = self.site(step.op)
        op, depth = site.op, site.depth
        # the combine of an accumulating op is folded into its launch: it reads its
        # accumulator tile after its own inputs and writes the combined tile back
        accumulates = isinstance(step, Launch) and step.mode == "accumulate"
        reads = (*op.ins, op.out) if accumulates else op.ins
        acc = "accumulator" if accumulates else None
        args = [self.arg(site, a, i, True, depth, prefer=acc if a is op.out else None)
                for i, a in enumerate(reads)]
        args.append(self.arg(site, op.out, len(reads), False, depth, prefer=acc))
        space = {d: (hi - lo, site.splits[d])
                 for d, (lo, hi) in zip(op.dim_names, site.tile, strict=True)}
        return OpSpec(op.fn, bool(op.reduction_dims), space, tuple(args), site.tiled(depth),
                      op.name)

    def step_spec(self, name: str, step: str, fn: str, depth: int) -> OpSpec:
        """An init or a copy over the op's output: one launch over the output's dims, inside
        the ``depth`` outer loops of the op."""
        site = self.site(name)
        out = site.op.out
        sizes = site.sizes_at(depth)
        space = {d: (sizes[d], site.splits[d]) for d in out.dims}
        if step == "copy":
            args: tuple[TensorArg, ...] = (
                self.arg(site, out, 0, True, depth, prefer="tile"),
                self.arg(site, out, 1, False, depth, prefer="full"))
        else:
            args = (self.arg(site, out, 0, False, depth, prefer="accumulator"),)
        return OpSpec(fn, False, space, args,
                      tuple(d for d in site.tiled(depth) if d in out.dims), f"{name}.{step}")

    def finish_spec(self, fin: Finish, depth: int) -> OpSpec:
        """At the end of the loop tiling the op's reduction (``depth`` loops outside it; 0:
        after the nest): its accumulator, cast (and for a mean scaled), copied out into the
        tensor's full buffer and its tile buffer, whichever it has."""
        site = self.site(fin.op)
        out = site.op.out
        sizes = site.sizes_at(depth)
        space = {d: (sizes[d], site.splits[d]) for d in out.dims}
        kinds = {b.kind for b in self.buffers.get(out.tensor, ())}
        args = [self.arg(site, out, 0, True, depth, prefer="accumulator")]
        for kind in ("full", "tile"):
            if kind in kinds:
                args.append(self.arg(site, out, len(args), False, depth, prefer=kind))
        return OpSpec(f"finish_{fin.fn}", False, space, tuple(args),
                      tuple(d for d in site.tiled(depth) if d in out.dims), f"{fin.op}.finish")

    def buffer(self, tensor: str, path: tuple[int, ...] | None, prefer: str | None) -> Buffer:
        """The buffer a launch at loop ``path`` reaches ``tensor`` through.

        Inside a group its own tile buffer wins, then the accumulator of that group; outside,
        the full buffer (an accumulator only where the tensor has no full one). ``prefer``
        names the kind a step needs.
        """
        found = self.buffers.get(tensor, [])
        if not found:
            raise EmitError(f"the plan places no buffer for tensor {tensor!r}; plan it with the "
                            "buffers and scratchpad passes")
        # a tile buffer lives in the outer loops of the launch (its group path is a prefix)
        tiles = [b for b in found if b.kind == "tile" and path is not None
                 and b.group == path[:len(b.group)]]
        whole = [b for b in found if b.kind != "tile"]
        if tiles and prefer in (None, "tile"):
            return tiles[0]
        if not whole:
            raise EmitError(f"tensor {tensor!r} has only tile buffers "
                            f"({[list(b.group) for b in found]}); nothing holds it whole")
        want = prefer or ("accumulator" if any(b.kind == "accumulator" and b.group == path
                                               for b in whole) else "full")
        return next((b for b in whole if b.kind == want), whole[0])

    def arg(self, site: _Site, access: Access, index: int, is_input: bool, depth: int,
            prefer: str | None = None) -> TensorArg:
        t = self.program.tensor(access.tensor)
        buf = self.buffer(t.name, site.path, prefer)
        dtype = buf.dtype or t.dtype
        fixed = buf.per_tile_fixed
        if buf.kind == "tile" or buf.kind == "accumulator" and (
                buf.space == "lx" or buf.shape != t.shape):
            # a tile, or a tile-sized accumulator (of the loops outside its reduction's)
            shape, strides = buf.shape, (0,) * depth
            lives = len(buf.group) if buf.kind == "tile" else self.accumulator_depth(t.name)
            if site.loops and depth > lives:
                # the launch sits in loops deeper than the buffer: its tile moves within the
                # buffer (one core's part of it, in the scratchpad)
                held = self.per_core(t.name, shape) if buf.space == "lx" else shape
                moves = tile_strides(access, padded_strides(held, dtype, self.target),
                                     site.level_steps(depth))
                strides = (0,) * lives + moves[lives:]
            fixed = not any(strides)
        else:
            shape = t.shape
            strides = (0,) * depth
            if site.loops and depth:
                strides = tile_strides(access, padded_strides(shape, dtype, self.target),
                                       site.level_steps(depth))
        return TensorArg(
            is_input=is_input, arg_index=index, dtype=dtype,
            device_size=device_layout(shape, dtype, self.target).shape,
            device_coordinates=device_coordinates(access, shape, dtype, self.target),
            allocation={buf.space: buf.offset}, per_tile_fixed=fixed,
            tensor=t.name, tile_strides=strides)

    def accumulator_depth(self, tensor: str) -> int:
        """How many loops hold ``tensor``'s accumulator: those outside its Init."""
        if tensor not in self.lives:
            raise EmitError(f"tensor {tensor!r} has an accumulator that no init of the "
                            "schedule resets")
        return self.lives[tensor]

    def per_core(self, tensor: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The extents of one core's part of a scratchpad tile of ``shape``: its producer's
        workers cut it as they cut the producer's tile (``Launch.part``)."""
        producer = self.program.producer(tensor)
        if producer is None:
            return shape
        site = self.site(producer.name)
        launch, splits = site.launch, site.splits
        out = []
        for e, n in zip(producer.out.index, shape, strict=True):
            d = e.single_dim
            if d is None and any(splits.get(x, 1) > 1 for x in e.dims):
                raise EmitError(
                    f"op {producer.name!r} writes tensor {tensor!r} through the merge "
                    f"{e.to_source()} split over cores, and its scratchpad tile is read in loops "
                    "deeper than the tile: one core's part of a merged axis has no scratchpad "
                    "layout (ops that write through a merge run outside loop nests) "
                    f"{cite('bundle-merged-scratchpad-tile')}")
            out.append(n if d is None or launch is None else launch.part(d, n))
        return tuple(out)


def bundle_mlir(schedule: Schedule, target: Target, unrolled: bool = False) -> str:
    """The loop bundle of a plan's ``schedule`` on ``target`` as MLIR text (``unrolled``:
    every iteration listed).

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/fused.json"), target=ap.targets.spyre(cores=32))
    >>> text = bundle_mlir(planned.lowered, planned.target)
    >>> text.splitlines()[0]
    '#tile_a = affine_map<(d0, d1)[s0] -> (s0 + d0 * 4194304 + d1 * 2048)>'
    """
    return render_bundle(from_schedule(schedule, target), schedule.program.name, unrolled)
