"""A program sharded over a mesh as MLIR: every device's module, with its collectives as
IREE's own ops (``flow.collective.*``), rendered from a ``schedule.mesh.MeshSchedule``
(``apportion.sharding.lower`` makes one); ``backends.iree.mesh`` runs the schedule.

``mesh_mlir`` emits one module per device (``// -----`` between them, as ``iree-opt
--split-input-file`` reads them): the parallel IR of each segment (``forall_mlir`` of its core
plan) and a function ``@PROGRAM.dD`` taking the device's input shards and returning its output
shards, which calls the segments in order and performs each step between them:

- a collective as ``flow.collective.all_gather|all_reduce|reduce_scatter|all_to_all`` on a
  ``!flow.channel``: ``flow.channel.default`` (whose ranks are the devices' indices) split
  (``flow.channel.split``) into the groups of devices along the step's mesh axis, colour the
  index of the group, key the device's rank in it (the default itself when one group holds
  every device in order). IREE's
  collectives move equal parts along dim 0, so each device's parts are placed, padded to the
  largest part, along a new leading dim of size 1 (what it sends to all) or the group size
  (one part per peer), and the result is assembled from the parts received with
  ``tensor.extract_slice``/``tensor.insert_slice`` at the boxes the schedule gives: uneven
  shards stay exact;
- a ``slice`` as ``tensor.extract_slice``;
- an argmax's keys unpacked, and a finish (a mean's ``scale``, an argmax's ``pack`` into
  keys) as an elementwise ``linalg.generic``.

Every module is parsed and verified with the compiler's MLIR bindings before it is returned.

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.lower import lower_plan
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.search import search
>>> s = lower_plan(search(load("examples/mlp.json"), parse("tp=2")))
>>> text = mesh_mlir(s)  # float16 partial sums move as f32, truncated once reduced
>>> "flow.collective.reduce_scatter sum, f32" in text, "arith.truncf" in text
(True, True)
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from apportion.errors import EmitError
from apportion.ir.program import TensorType
from apportion.mlir.bodies import REDUCER_OPS
from apportion.mlir.builder import SsaNames, symbol_name, verify_mlir
from apportion.mlir.forall import forall_mlir
from apportion.mlir.types import MLIR_TYPES, mlir_type
from apportion.plans.tiles import Region
from apportion.schedule.mesh import (
    MAX_KEYED_INDEX,
    READS,
    Collective,
    Compute,
    DeviceLaunch,
    FinishPart,
    MeshFinish,
    MeshSchedule,
    box_shape,
    intersect,
    within,
)

#: tensor dtype -> IREE's collective element type: its MLIR element type, integers signed (no
#: truth values)
COLLECTIVE_TYPES = {d: f"s{e}" if e.startswith("i") else e for d, e in MLIR_TYPES.items()
                    if e != "i1"}


#: an SSA name in a generic's body template
_NAME = re.compile(r"%[A-Za-z_][A-Za-z0-9_]*")


def _tensor(shape: Sequence[int], dtype: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}{'x' if shape else ''}{mlir_type(dtype)}>"


def _ints(values: Sequence[int]) -> str:
    return "[" + ", ".join(map(str, values)) + "]"


def _f64(value: float) -> str:
    """An exact f64 literal (its bit pattern)."""
    return f"0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016X}"


@dataclass(frozen=True)
class Exchange:
    """How one device takes part in an all-gather, all-to-all or reduce-scatter as IREE runs
    them, on equal parts along dim 0: its send buffer has one slot per entry of ``sends``
    (the box of the tensor it puts there, None: nothing), each slot padded to ``pad``; IREE
    gives it a buffer of ``slots_in`` slots; ``recvs`` says which slot holds which box of its
    result. An all-gather sends one slot to all and receives one per rank; an all-to-all
    sends slot ``k`` to rank ``k`` and receives one per rank; a reduce-scatter sends slot
    ``k`` for rank ``k`` to reduce and receives the one reduced slot of its rank. A ``halo``
    or ``peer_read`` is an all-to-all of exactly the parts each peer lacks (slots padded to
    the largest such part, not to a shard): ``keep`` is the part of its result the device
    holds already, copied locally, and it sends itself nothing."""

    pad: tuple[int, ...]
    sends: tuple[Region | None, ...]
    slots_in: int
    recvs: tuple[tuple[int, Region], ...]
    keep: Region | None = None


def exchange(c: Collective, device: int) -> Exchange:
    """``device``'s part in ``c`` (not a slice nor an all-reduce), from the schedule's boxes.

    >>> c = Collective("all_gather", "x", "x", "x@1", "float32", "tp", ((0, 1, 2),),
    ...                (((0, 2),), ((2, 4),), ((4, 5),)), (((0, 5),),) * 3, dim=0)
    >>> e = exchange(c, 2)
    >>> e.pad, e.sends, e.slots_in, e.recvs[1]
    ((2,), (((4, 5),),), 3, (1, ((2, 4),)))
    """
    if c.kind not in ("all_gather", "all_to_all", "reduce_scatter", *READS):
        raise EmitError(f"{c} exchanges no parts")
    group = c.group(device)
    src, dst = c.src_boxes[device], c.dst_boxes[device]
    if c.kind in READS:  # only what a peer lacks crosses; each keeps its own part
        parts = [b for p in group for q in group
                 if p != q and (b := c.lacked(p, q)) is not None]
        pad = tuple(max((box_shape(b)[i] for b in parts), default=1) for i in range(len(src)))
        return Exchange(pad, tuple(None if q == device else c.lacked(device, q)
                                   for q in group), len(group),
                        tuple((k, b) for k, p in enumerate(group)
                              if p != device and (b := c.lacked(p, device)) is not None),
                        intersect(src, dst))
    if c.kind == "all_gather":
        parts: list[Region] = [c.src_boxes[p] for p in group]
        sends: tuple[Region | None, ...] = (src,)
        recvs = tuple((k, b) for k, p in enumerate(group)
                      if (b := intersect(c.src_boxes[p], dst)) is not None)
    else:
        parts = [b for p in group for q in group
                 if (b := intersect(c.src_boxes[p], c.dst_boxes[q])) is not None]
        sends = tuple(intersect(src, c.dst_boxes[q]) for q in group)
        if c.kind == "all_to_all":
            recvs = tuple((k, b) for k, p in enumerate(group)
                          if (b := intersect(c.src_boxes[p], dst)) is not None)
        else:
            recvs = ((0, dst),)
    pad = tuple(max(box_shape(b)[i] for b in parts) for i in range(len(src)))
    return Exchange(pad, sends, 1 if c.kind == "reduce_scatter" else len(group), recvs)


class _DeviceFunction:
    """The function of one device: its segments called, its steps between them as ops."""

    def __init__(self, schedule: MeshSchedule, device: int) -> None:
        self.s = schedule
        self.d = device
        self.names = SsaNames()
        self.lines: list[str] = []
        self.values: dict[str, tuple[str, TensorType]] = {}
        self.world: str | None = None
        self.channels: dict[str, str] = {}
        self.constants: dict[str, str] = {}

    def const(self, value: int | str, ty: str) -> str:
        key = f"{value} : {ty}"
        if key not in self.constants:
            name = self.names.fresh(f"c{value}_{ty}" if isinstance(value, int) else "cst")
            self.lines.append(f"  {name} = arith.constant {key}")
            self.constants[key] = name
        return self.constants[key]

    def text(self) -> str:
        s, dev = self.s, self.s.devices[self.d]
        types = {t.name: t for launch in s.launches(self.d)
                 for t in launch.schedule.program.tensors}
        args = []
        for place in dev.inputs:
            t = s.program.tensor(place.tensor)
            ty = TensorType(place.local, tuple(hi - lo for lo, hi in place.box), t.dtype)
            name = self.names.fresh(place.local)
            self.values[place.local] = (name, ty)
            args.append(f"{name}: {_tensor(ty.shape, ty.dtype)}")
        for stage in s.stages:
            if isinstance(stage, Compute):
                self.call(stage.launches[self.d], types)
            elif isinstance(stage, MeshFinish):
                self.finish(stage.parts[self.d], stage.op)
            else:
                self.collective(stage)
        results = [self.values[p.local] for p in dev.outputs]
        tys = ", ".join(_tensor(ty.shape, ty.dtype) for _, ty in results)
        fn = symbol_name(f"{s.program.name}.d{self.d}")
        head = f"func.func @{fn}({', '.join(args)}) -> ({tys}) {{"
        ret = f"  return {', '.join(n for n, _ in results)} : {tys}"
        return "\n".join([head, *self.lines, ret, "}"])

    def call(self, launch: DeviceLaunch, types: Mapping[str, TensorType]) -> None:
        prog = launch.schedule.program
        ins = [self.values[n] for n in prog.inputs]
        outs = []
        for n in prog.outputs:
            ty = prog.tensor(n)
            outs.append((self.names.fresh(n), ty))
        in_tys = ", ".join(_tensor(ty.shape, ty.dtype) for _, ty in ins)
        out_tys = ", ".join(_tensor(ty.shape, ty.dtype) for _, ty in outs)
        self.lines.append(f"  {', '.join(n for n, _ in outs)} = func.call "
                          f"@{symbol_name(launch.name)}({', '.join(n for n, _ in ins)}) : "
                          f"({in_tys}) -> ({out_tys})")
        for n, (ssa, ty) in zip(prog.outputs, outs, strict=True):
            self.values[n] = (ssa, ty)

    def _named(self, value: str, tensor: str) -> str:
        """``value``, defined by this function's last op defining it, renamed after the local
        tensor it holds (the module reads as the plan names its tensors). A value defined
        elsewhere (an argument, a segment's result) keeps its name."""
        if re.fullmatch(rf"%{re.escape(symbol_name(tensor))}(_\d+)?", value):
            return value  # named after it already
        for k in range(len(self.lines) - 1, -1, -1):
            if self.lines[k].startswith(f"  {value} = "):
                name = self.names.fresh(tensor)
                self.lines[k] = f"  {name} = " + self.lines[k][len(f"  {value} = "):]
                return name
        return value

    def channel(self, c: Collective) -> str:
        """The channel of ``c``'s groups: the default one split by group and rank (the
        default itself when one group holds every device in order)."""
        if self.world is None:
            self.world = self.names.fresh("world")
            self.lines.append(f"  {self.world} = flow.channel.default : !flow.channel")
        if c.groups == (tuple(range(len(self.s.devices))),):
            return self.world
        if c.axis not in self.channels:
            name = self.names.fresh(f"channel_{c.axis}")
            color = self.const(c.color(self.d), "index")
            key = self.const(c.rank(self.d), "index")
            self.lines.append(f"  {name} = flow.channel.split {self.world}, {color}, {key} : "
                              "!flow.channel -> !flow.channel")
            self.channels[c.axis] = name
        return self.channels[c.axis]

    def empty(self, stem: str, shape: Sequence[int], dtype: str, fill: bool) -> str:
        name = self.names.fresh(stem)
        ty = _tensor(shape, dtype)
        self.lines.append(f"  {name} = tensor.empty() : {ty}")
        if not fill:
            return name
        zero = self.const("0.0" if dtype.startswith(("float", "bfloat")) else "0",
                          mlir_type(dtype))
        filled = self.names.fresh(f"{stem}_zero")
        self.lines.append(f"  {filled} = linalg.fill ins({zero} : {mlir_type(dtype)}) "
                          f"outs({name} : {ty}) -> {ty}")
        return filled

    def extract(self, src: str, src_shape: Sequence[int], offsets: Sequence[int],
                sizes: Sequence[int], result_shape: Sequence[int], dtype: str) -> str:
        name = self.names.fresh("part")
        self.lines.append(f"  {name} = tensor.extract_slice {src}{_ints(offsets)}"
                          f"{_ints(sizes)}{_ints([1] * len(sizes))} : "
                          f"{_tensor(src_shape, dtype)} to {_tensor(result_shape, dtype)}")
        return name

    def insert(self, part: str, part_shape: Sequence[int], dest: str,
               dest_shape: Sequence[int], offsets: Sequence[int], sizes: Sequence[int],
               dtype: str) -> str:
        name = self.names.fresh("placed")
        self.lines.append(f"  {name} = tensor.insert_slice {part} into {dest}{_ints(offsets)}"
                          f"{_ints(sizes)}{_ints([1] * len(sizes))} : "
                          f"{_tensor(part_shape, dtype)} into {_tensor(dest_shape, dtype)}")
        return name

    def collective(self, c: Collective) -> None:
        d = self.d
        src_name, src_ty = self.values[c.source]
        src, dst = c.src_boxes[d], c.dst_boxes[d]
        dtype = src_ty.dtype
        dst_ty = TensorType(c.result, box_shape(dst), dtype)
        if c.kind == "slice":
            res = self.extract(src_name, src_ty.shape, [lo for lo, _ in within(dst, src)],
                               box_shape(dst), box_shape(dst), dtype)
            self.values[c.result] = (self._named(res, c.result), dst_ty)
            return
        elt = COLLECTIVE_TYPES.get(dtype)
        if elt is None:
            raise EmitError(f"{c.kind} of tensor {c.tensor!r} along axis {c.axis!r}: IREE's "
                            f"collectives carry no {dtype} elements (they carry "
                            f"{', '.join(COLLECTIVE_TYPES)})")
        reduction = ""
        if c.reducer is not None:
            ops = REDUCER_OPS.get(c.reducer)
            if ops is None or ops.collective is None:
                have = [n for n, r in REDUCER_OPS.items() if r.collective is not None]
                raise EmitError(f"{c.kind} of tensor {c.tensor!r} along axis {c.axis!r}: "
                                f"IREE's collectives have no {c.reducer!r} reduction (they "
                                f"have {', '.join(have)})")
            reduction = f"{ops.collective}, "
        ch = self.channel(c)
        self.lines.append(f"  // collective: {c} over devices {list(c.group(d))}")
        if c.kind == "all_reduce":
            target = self.empty("reduced", src_ty.shape, dtype, False)
            ty = _tensor(src_ty.shape, dtype)
            res = self.names.fresh(c.result)
            self.lines.append(f"  {res} = flow.collective.all_reduce {reduction}{elt}, "
                              f"{target}, {src_name}, {ch} : ({ty}, {ty}, !flow.channel) -> "
                              f"{target} as {ty}")
            if dst != src:
                res = self.extract(res, src_ty.shape, [lo for lo, _ in within(dst, src)],
                                   box_shape(dst), box_shape(dst), dtype)
        else:
            res = self._exchange(c, src_name, dtype, elt, reduction, ch)
        if c.unpack:
            res = self._unpack(res, box_shape(dst))
        if c.out_dtype != dtype:  # partials reduced in their partial dtype, now whole
            res = self._narrow(c, res, box_shape(dst), dtype)
            dst_ty = TensorType(c.result, box_shape(dst), c.out_dtype)
        self.values[c.result] = (self._named(res, c.result), dst_ty)

    def _narrow(self, c: Collective, value: str, shape: Sequence[int], dtype: str) -> str:
        """A reduction's total cast from the dtype its partials moved in to ``c.out_dtype``
        (a float16 sum's float32 partials, reduced, rounded once to float16)."""
        wide, narrow = mlir_type(dtype), mlir_type(c.out_dtype)
        floats = ("float", "bfloat")
        if not (dtype.startswith(floats) and c.out_dtype.startswith(floats)):
            raise EmitError(f"{c.kind} of tensor {c.tensor!r} along axis {c.axis!r}: its "
                            f"{dtype} total has no cast to {c.out_dtype} here (partials widen "
                            "only for float reductions)")
        body = [f"%n = arith.truncf %x : {wide} to {narrow}"]
        return self._generic("narrowed", [(value, dtype)], shape, c.out_dtype, body,
                             ["%x", "%unused"], "%n")

    def _exchange(self, c: Collective, src_name: str, dtype: str, elt: str, reduction: str,
                  ch: str) -> str:
        """An all-gather, all-to-all or reduce-scatter as ``exchange`` lays it out: the
        device's parts placed in the send buffer, exchanged, its result assembled."""
        d = self.d
        src, dst = c.src_boxes[d], c.dst_boxes[d]
        lay = exchange(c, d)
        rank = len(src)
        send_shape, recv_shape = [len(lay.sends), *lay.pad], [lay.slots_in, *lay.pad]
        padded = any(b is None or list(box_shape(b)) != list(lay.pad) for b in lay.sends)
        buf = self.empty("send", send_shape, dtype, padded)
        src_shape = box_shape(src)
        for k, part in enumerate(lay.sends):
            if part is None:
                continue
            shape = box_shape(part)
            piece = src_name if part == src else self.extract(
                src_name, src_shape, [lo for lo, _ in within(part, src)], shape, shape, dtype)
            buf = self.insert(piece, shape, buf, send_shape, [k] + [0] * rank, [1, *shape],
                              dtype)
        target = self.empty("recv", recv_shape, dtype, False)
        got = self.names.fresh("exchanged")
        kind = "all_to_all" if c.kind in READS else c.kind
        self.lines.append(f"  {got} = flow.collective.{kind} {reduction}{elt}, {target}, "
                          f"{buf}, {ch} : ({_tensor(recv_shape, dtype)}, "
                          f"{_tensor(send_shape, dtype)}, !flow.channel) -> {target} as "
                          f"{_tensor(recv_shape, dtype)}")
        dst_shape = box_shape(dst)
        out = None
        if lay.keep is not None:  # a read: the part the device holds, copied locally
            shape = box_shape(lay.keep)
            piece = src_name if lay.keep == src else self.extract(
                src_name, src_shape, [lo for lo, _ in within(lay.keep, src)], shape, shape,
                dtype)
            if lay.keep == dst:
                return piece
            out = self.insert(piece, shape, self.empty(c.result, dst_shape, dtype, False),
                              dst_shape, [lo for lo, _ in within(lay.keep, dst)], shape, dtype)
        for k, part in lay.recvs:
            shape = box_shape(part)
            piece = self.extract(got, recv_shape, [k] + [0] * rank, [1, *shape], shape, dtype)
            if part == dst:
                return piece
            if out is None:
                out = self.empty(c.result, dst_shape, dtype, False)
            out = self.insert(piece, shape, out, dst_shape, [lo for lo, _ in within(part, dst)],
                              shape, dtype)
        assert out is not None
        return out

    def _generic(self, stem: str, ins: Sequence[tuple[str, str]], shape: Sequence[int],
                 out_dtype: str, body: Sequence[str], args: Sequence[str], result: str) -> str:
        """An elementwise ``linalg.generic`` over ``shape``: ``ins`` (value, dtype), the block
        arguments named ``args`` (inputs then the output), ``body`` lines yielding ``result``."""
        # the body's names made fresh in the function (a tensor may be called %low too)
        fresh: dict[str, str] = {}

        def rename(m: re.Match[str]) -> str:
            return fresh.setdefault(m.group(0), self.names.fresh(m.group(0)[1:]))

        args = [_NAME.sub(rename, a) for a in args]
        body = [_NAME.sub(rename, line) for line in body]
        result = _NAME.sub(rename, result)
        rank = len(shape)
        dims = ", ".join(f"d{i}" for i in range(rank))
        ident = f"affine_map<({dims}) -> ({dims})>"
        init = self.empty(f"{stem}_init", shape, out_dtype, False)
        name = self.names.fresh(stem)
        out_ty = _tensor(shape, out_dtype)
        in_tys = ", ".join(_tensor(shape, dt) for _, dt in ins)
        block = ", ".join(f"{a}: {mlir_type(dt)}" for a, dt in
                          zip(args, [*(dt for _, dt in ins), out_dtype], strict=True))
        maps = ", ".join([ident] * (len(ins) + 1))
        iters = ", ".join(['"parallel"'] * rank)
        self.lines += [
            f"  {name} = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{iters}]}} "
            f"ins({', '.join(v for v, _ in ins)} : {in_tys}) outs({init} : {out_ty}) {{",
            f"  ^bb0({block}):",
            *(f"    {line}" for line in body),
            f"    linalg.yield {result} : {mlir_type(out_dtype)}",
            f"  }} -> {out_ty}"]
        return name

    def _unpack(self, keys: str, shape: Sequence[int]) -> str:
        """The flat index in argmax keys: ``MAX_KEYED_INDEX - (key & MAX_KEYED_INDEX)``."""
        body = [f"%low = arith.constant {MAX_KEYED_INDEX} : i64",
                "%bits = arith.andi %key, %low : i64",
                "%index = arith.subi %low, %bits : i64"]
        return self._generic("unpacked", [(keys, "int64")], shape, "int64", body,
                             ["%key", "%unused"], "%index")

    def finish(self, part: FinishPart, op: str) -> None:
        (src, src_ty) = self.values[part.sources[0]]
        shape = src_ty.shape
        self.lines.append(f"  // finish of op {op}: {part.kind}")
        if part.kind == "scale":
            ty = mlir_type(part.dtype)
            if not part.dtype.startswith(("float", "bfloat")):
                raise EmitError(f"finish of op {op!r}: a scaled mean of {part.dtype} has no "
                                "MLIR form here (only floats are split by devices)")
            widen = [] if ty == "f64" else [f"%w = arith.extf %x : {ty} to f64"]
            x = "%x" if ty == "f64" else "%w"
            narrow = [] if ty == "f64" else [f"%r = arith.truncf %m : f64 to {ty}"]
            body = [*widen, f"%f = arith.constant {_f64(part.factor)} : f64",
                    f"%m = arith.mulf {x}, %f : f64", *narrow]
            res = self._generic("scaled", [(src, part.dtype)], shape, part.dtype, body,
                                ["%x", "%unused"], "%m" if ty == "f64" else "%r")
        else:
            idx, _ = self.values[part.sources[1]]
            res = self._generic("packed", [(src, src_ty.dtype), (idx, "int64")], shape, "int64",
                                _pack_body(part, src_ty.dtype), ["%v", "%i", "%unused"],
                                "%key")
        self.values[part.result] = (self._named(res, part.result),
                                    TensorType(part.result, shape, part.dtype))


def _pack_body(part: FinishPart, dtype: str) -> list[str]:
    """The scalar body of ``argmax_keys`` on (``%v``, the global flat index of ``%i``)."""
    ty = mlir_type(dtype)
    if dtype.startswith(("float", "bfloat")):
        widen = [] if ty == "f32" else [f"%vf = arith.extf %v : {ty} to f32"]
        v = "%v" if ty == "f32" else "%vf"
        high = [*widen,
                "%nan = arith.constant 0x7FC00000 : f32",
                "%zero = arith.constant 0.0 : f32",
                f"%isnan = arith.cmpf uno, {v}, {v} : f32",
                f"%plus = arith.addf {v}, %zero : f32",  # -0 + 0 = +0
                "%canon = arith.select %isnan, %nan, %plus : f32",
                "%bits = arith.bitcast %canon : f32 to i32",
                "%wide = arith.extsi %bits : i32 to i64",
                "%c0 = arith.constant 0 : i64",
                "%mask = arith.constant 2147483647 : i64",
                "%neg = arith.cmpi slt, %wide, %c0 : i64",
                "%flip = arith.xori %wide, %mask : i64",
                "%high = arith.select %neg, %flip, %wide : i64"]
    elif ty == "i64":
        high = ["%c0 = arith.constant 0 : i64", "%high = arith.addi %v, %c0 : i64"]
    else:
        high = [f"%high = arith.extsi %v : {ty} to i64"]
    # the local flat index unravelled over the device's reduction box, moved to its start and
    # ravelled over the whole reduction
    lines = list(high)
    rest = "%i"
    flat = None
    stride = 1
    n = len(part.local)
    coords = []
    for j in range(n - 1, -1, -1):
        size = part.local[j]
        lines.append(f"%l{j} = arith.constant {size} : i64")
        lines.append(f"%q{j} = arith.remsi {rest}, %l{j} : i64")
        if j:
            lines.append(f"%r{j} = arith.divsi {rest}, %l{j} : i64")
            rest = f"%r{j}"
        coords.append(j)
    for j in range(n - 1, -1, -1):
        lines.append(f"%s{j} = arith.constant {part.starts[j]} : i64")
        lines.append(f"%g{j} = arith.addi %q{j}, %s{j} : i64")
        lines.append(f"%t{j} = arith.constant {stride} : i64")
        lines.append(f"%p{j} = arith.muli %g{j}, %t{j} : i64")
        if flat is None:
            flat = f"%p{j}"
        else:
            lines.append(f"%a{j} = arith.addi {flat}, %p{j} : i64")
            flat = f"%a{j}"
        stride *= part.sizes[j]
    assert flat is not None
    lines += [f"%low = arith.constant {MAX_KEYED_INDEX} : i64",
              "%c32 = arith.constant 32 : i64",
              "%up = arith.shli %high, %c32 : i64",
              f"%inv = arith.subi %low, {flat} : i64",
              "%key = arith.ori %up, %inv : i64"]
    return lines


def device_mlir(schedule: MeshSchedule, device: int) -> str:
    """Device ``device``'s module (not verified; ``mesh_mlir`` verifies): its segments'
    parallel IR, then its function calling them with the collectives between."""
    dev = schedule.devices[device]
    coords = ", ".join(f"{a}={c}" for a, c in dev.coords)
    parts = [f"// device {device} ({coords}) of mesh {schedule.mesh}"]
    for launch in schedule.launches(device):
        seg = replace(launch.schedule, program=replace(launch.schedule.program,
                                                       name=launch.name))
        parts.append(f"// segment {launch.name}")
        parts.append(forall_mlir(seg).rstrip("\n"))
    parts.append(f"// device {device}: its segments in order, the collectives between them")
    parts.append(_DeviceFunction(schedule, device).text())
    return "\n".join(parts) + "\n"


def mesh_mlir(schedule: MeshSchedule) -> str:
    """Every device's module, each verified, ``// -----`` between them."""
    modules = []
    for d in range(len(schedule.devices)):
        text = device_mlir(schedule, d)
        verify_mlir(text)
        modules.append(text)
    return "// -----\n".join(modules)
