"""A simulator of LoopSpec programs: runs every launch of the nest on the plan's buffers.

Only what a LoopSpec says is used, read by the addressing convention of ``addressing``:
per launch its iteration space, and per tensor its address, tile strides, device size and
device coordinates. The address picks the plan buffer of the tensor (full, tile or accumulator)
and, past the buffer's start, the tile's origin: a row-major byte offset over the buffer's shape
with its innermost dim padded to whole sticks (``padded_strides``); the device coordinates of a
point, one per device dim of the buffer's layout (``target.layout``), give the element within
the tile (sticks times elements per stick plus the element in its stick). So a launch touches
the right elements only when its addressing is right. Each buffer is a float64 array of its
shape (NaN until written); a coordinate outside its device dim, an element outside the buffer,
and a non-reduction launch that writes one element twice fail.

Kernels: pointwise kinds (the registry's semantics), matmul, ``sum``, ``max``, ``min`` and
``mean`` reductions (an op reading its own output as the last input accumulates a sum into it),
``fill`` (the identity of sums, 0), ``copy`` and ``finish_sum``. A scratchpad tile that moves
within its buffer (one core's part of it) is not simulated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import numpy as np

from apportion.backends.bundle.addressing import padded_strides
from apportion.ir.kinds import resolve
from apportion.ir.program import Program
from apportion.plans.memory import Buffer
from apportion.plans.plan import Plan
from apportion.runtime import kernels
from apportion.schedule.loopspec_values import OpSpec, Spec, TensorArg
from apportion.target.layout import device_layout
from apportion.target.target import Target

_WORD = re.compile(r"\b(floordiv|mod)\b")


def evaluate(expr: str | int, env: Mapping[str, object]) -> object:
    """An affine expression of the specs (``(h * 64 + d) floordiv 32``) over ``env``."""
    if isinstance(expr, int):
        return expr
    text = _WORD.sub(lambda m: "//" if m[1] == "floordiv" else "%", expr)
    return eval(text, {"__builtins__": {}}, dict(env))  # noqa: S307 - specs the tests made


class Simulator:
    """The plan's buffers as arrays of their shapes, and the launches of a LoopSpec program."""

    def __init__(self, program: Program, plan: Plan, target: Target,
                 params: Mapping[str, int] | None = None) -> None:
        self.program, self.plan, self.target = program, plan, target
        self.params = dict(params or {})
        self.arrays: dict[Buffer, np.ndarray] = {b: np.full(b.shape, np.nan)
                                                 for b in plan.buffers}
        self.launches = 0

    def _dtype(self, b: Buffer) -> str:
        return b.dtype or self.program.tensor(b.tensor).dtype

    def whole(self, name: str) -> np.ndarray:
        """The buffer that holds tensor ``name`` whole (a full one, else an accumulator of
        its shape)."""
        shape = self.program.tensor(name).shape
        found = [b for b in self.plan.buffers_of(name) if b.kind != "tile" and b.shape == shape]
        found.sort(key=lambda b: b.kind != "full")
        return self.arrays[found[0]]

    def store(self, name: str, value: np.ndarray) -> None:
        self.whole(name)[...] = np.asarray(value, dtype=np.float64)

    def load(self, name: str) -> np.ndarray:
        return self.whole(name)

    # -- the nest -------------------------------------------------------------------------------

    def run(self, specs: tuple[Spec, ...], indices: tuple[int, ...] = ()) -> None:
        for s in specs:
            if isinstance(s, OpSpec):
                self.launch(s, indices)
                continue
            count = s.count if isinstance(s.count, int) else self.params[s.count]
            for i in range(count):
                self.run(s.body, (*indices, i))

    def _buffer(self, a: TensorArg) -> Buffer:
        found = [b for b in self.plan.buffers_of(a.tensor) if b.space == a.memory
                 and b.offset <= a.address < b.offset + device_layout(
                     b.shape, self._dtype(b), self.target).nbytes]
        assert len(found) == 1, (a, found)
        return found[0]

    def _elements(self, a: TensorArg, env: Mapping[str, np.ndarray], shape: tuple[int, ...],
                  indices: tuple[int, ...]) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The buffer ``a`` reaches and the element each point touches (one index array per
        buffer axis)."""
        buf = self._buffer(a)
        layout = device_layout(buf.shape, a.dtype, self.target)
        assert tuple(a.device_size) == layout.shape, (a, layout.shape)
        moves = not a.per_tile_fixed and any(a.tile_strides)
        offset = a.address - buf.offset
        if moves:
            if a.memory == "lx":
                raise NotImplementedError(f"{a.tensor}: a scratchpad tile moving in its buffer")
            assert len(a.tile_strides) == len(indices), (a.tensor, a.tile_strides, indices)
            offset += sum(int(evaluate(s, self.params)) * i
                          for s, i in zip(a.tile_strides, indices, strict=True))
        strides = padded_strides(buf.shape, a.dtype, self.target)
        origin = []
        for st in strides:
            origin.append(offset // st)
            offset %= st
        assert offset == 0, f"{a.tensor}: address {a.address} is not an element's"
        index = [np.full(shape, o) for o in origin]
        for dd, c in zip(layout.dims, a.device_coordinates, strict=True):
            v = np.broadcast_to(np.asarray(evaluate(c, env)), shape)
            assert np.all((v >= 0) & (v < dd.size)), f"{a.tensor}: {c} outside 0..{dd.size}"
            index[dd.tensor_dim] = index[dd.tensor_dim] + (
                v * layout.elems_per_stick if dd.part == "sticks" else v)
        for k, n in enumerate(buf.shape):
            assert np.all(index[k] < n), f"{a.tensor}: axis {k} reaches past {n}"
        return self.arrays[buf], tuple(index)

    def launch(self, op: OpSpec, indices: tuple[int, ...]) -> None:
        self.launches += 1
        dims = list(op.iteration_space)
        shape = tuple(n for n, _ in op.iteration_space.values())
        env = dict(zip(dims, np.indices(shape), strict=True)) if dims else {}
        ins = [a for a in op.args if a.is_input]
        (out,) = [a for a in op.args if not a.is_input]
        used = set(re.findall(r"[A-Za-z_]\w*", " ".join(out.device_coordinates)))
        red = tuple(i for i, d in enumerate(dims) if d not in used)
        arr, at = self._elements(out, env, shape, indices)
        reads = []
        for a in ins:
            src, where = self._elements(a, env, shape, indices)
            reads.append(src[where])
        if op.op == "fill":
            arr[at] = 0.0
            return
        if op.op in ("copy", "finish_sum"):
            self._write_once(op, arr, at, reads[0])
            return
        accumulates = bool(ins) and ins[-1].tensor == out.tensor and op.is_reduction
        if accumulates:
            reads = reads[:-1]
        if op.op == "matmul":
            value, reducer = reads[0] * reads[1], "sum"
        else:
            kind = resolve(op.op, len(reads), op.is_reduction)
            if kind.reducer is None:
                self._write_once(op, arr, at, kernels.pointwise(kind, *reads))
                return
            value, reducer = reads[0], kind.reducer.name
        if accumulates and reducer != "sum":
            raise NotImplementedError(f"{op.name}: the simulator accumulates only sums")
        assert red, f"{op.name}: a reduction whose output indexes every dim"
        flat = np.ravel_multi_index(at, arr.shape).ravel()
        keys, inverse = np.unique(flat, return_inverse=True)
        counts = np.bincount(inverse, minlength=len(keys))
        assert np.all(counts == counts[0]), f"{op.name}: output points reduce unevenly"
        value = np.broadcast_to(value, shape).ravel()
        if reducer in ("sum", "mean"):
            acc = np.zeros(len(keys))
            np.add.at(acc, inverse, value)
            if reducer == "mean":
                acc /= math.prod(shape[i] for i in red)
        elif reducer in ("max", "min"):
            ufunc = np.maximum if reducer == "max" else np.minimum
            acc = np.full(len(keys), -np.inf if reducer == "max" else np.inf)
            ufunc.at(acc, inverse, value)
        else:
            raise NotImplementedError(f"{op.name}: the simulator has no {reducer} kernel")
        view = arr.reshape(-1)
        view[keys] = view[keys] + acc if accumulates else acc

    @staticmethod
    def _write_once(op: OpSpec, arr: np.ndarray, at: tuple[np.ndarray, ...],
                    value: np.ndarray) -> None:
        flat = np.ravel_multi_index(at, arr.shape).ravel()
        assert len(np.unique(flat)) == len(flat), f"{op.name}: an element written twice"
        arr.reshape(-1)[flat] = np.broadcast_to(value, at[0].shape).ravel()


def simulate(program: Program, plan: Plan, target: Target, specs: tuple[Spec, ...],
             inputs: Mapping[str, np.ndarray], params: Mapping[str, int] | None = None
             ) -> dict[str, np.ndarray]:
    """The program's outputs after running ``specs`` on ``inputs``."""
    sim = Simulator(program, plan, target, params)
    for name in program.inputs:
        sim.store(name, inputs[name])
    sim.run(specs)
    return {name: sim.load(name) for name in program.outputs}
