"""The loop bundle: a planned program's LoopSpec nest (``schedule.loopspec_values``, built by
``backends.bundle.loopspec``) as MLIR text, ``scf.for`` loops around kernel launches.

One ``func.func`` holds the LoopSpec nest: each LoopSpec becomes an ``scf.for`` from 0 to its
count (a function ``index`` argument when the count is symbolic), each OpSpec one unregistered
``"apportion.execute"`` op naming its kernel file and taking one address per tensor. A tensor in
device memory whose tile moves with the loops gets an ``affine_map`` from the loop indices to its
tile's byte address (``s0``, its base, plus stride × index per level), applied with
``affine.apply`` inside the loops; tensors at a fixed place (scratchpad offsets, per-tile
buffers, tensors no loop tiles) are passed as constants.

>>> from apportion.mlir.builder import verify_mlir
>>> from apportion.schedule.loopspec_values import LoopSpec, OpSpec, TensorArg
>>> a = TensorArg(True, 0, "float16", [4, 64], ["m", "n"], {"hbm": 0}, tensor="a",
...               tile_strides=[512])
>>> y = TensorArg(False, 1, "float16", [4, 64], ["m", "n"], {"lx": 0}, True, tensor="y",
...               tile_strides=[0])
>>> text = render_bundle((LoopSpec(2, [OpSpec("exp", False, {"m": (4, 1), "n": (64, 1)},
...                                           [a, y], ["m"], "e")]),), "f")
>>> print(text.splitlines()[0])
#tile_a = affine_map<(d0)[s0] -> (s0 + d0 * 512)>
>>> verify_mlir(text)
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from apportion.errors import EmitError
from apportion.mlir.builder import SsaNames, alias_name, check_index, symbol_name
from apportion.schedule.loopspec_values import LoopSpec, OpSpec, Spec, TensorArg, walk

INDENT = "  "
#: the most launches an unrolled bundle lists (each is a line of MLIR text)
MAX_UNROLLED_LAUNCHES = 100_000


def stride_symbols(strides: tuple[int | str, ...]) -> list[str]:
    """The symbolic loop counts the strides depend on, in order of appearance."""
    out: list[str] = []
    for s in strides:
        if isinstance(s, str):
            out += [n for n in re.findall(r"[A-Za-z_]\w*", s) if n != "floordiv" and n not in out]
    return out


def address_map(strides: tuple[int | str, ...]) -> str:
    """The affine map of a tile address: loop indices as dims, the base address as ``s0``.

    Symbolic counts a stride depends on follow as ``s1, s2, ...`` (see ``stride_symbols``).

    >>> address_map((4194304, 2048))
    'affine_map<(d0, d1)[s0] -> (s0 + d0 * 4194304 + d1 * 2048)>'
    >>> address_map((0, "8192 floordiv T"))
    'affine_map<(d0, d1)[s0, s1] -> (s0 + d1 * (8192 floordiv s1))>'
    """
    symbols = {n: f"s{i}" for i, n in enumerate(stride_symbols(strides), start=1)}
    dims = ", ".join(f"d{i}" for i in range(len(strides)))
    terms = ""
    for i, s in enumerate(strides):
        if isinstance(s, str):
            expr = re.sub(r"[A-Za-z_]\w*", lambda m: symbols.get(m[0], m[0]), s)
            terms += f" + d{i} * ({expr})"
        elif s:
            terms += f" + d{i} * {s}"
    syms = ", ".join(["s0", *symbols.values()])
    return f"affine_map<({dims})[{syms}] -> (s0{terms})>"




def _moves(a: TensorArg) -> bool:
    # device memory, or a scratchpad tile read in loops deeper than its buffer
    return not a.per_tile_fixed and any(a.tile_strides)


def _execute(op: OpSpec, values: list[str]) -> str:
    attrs = {
        "kernel": f'"{op.kernel}"',
        "op": f'"{op.op}"',
        "tensors": "[" + ", ".join(f'"{a.tensor or a.arg_index}"' for a in op.args) + "]",
        "memory": "[" + ", ".join(f'"{a.memory}"' for a in op.args) + "]",
        "num_inputs": f"{sum(a.is_input for a in op.args)} : i64",
    }
    attr_text = ", ".join(f"{k} = {v}" for k, v in attrs.items())
    types = ", ".join("index" for _ in values)
    return f'"apportion.execute"({", ".join(values)}) {{{attr_text}}} : ({types}) -> ()'


class _Rolled:
    """The rolled bundle of one LoopSpec program: names, constants and maps, then the body."""

    def __init__(self, specs: tuple[Spec, ...]) -> None:
        self.names = SsaNames()
        self.symbols: dict[str, str] = {}  # symbolic count -> function argument
        self.consts: dict[int, str] = {}
        self.bases: dict[tuple[str, int | str, int], str] = {}  # (memory, tensor, address)
        self.maps: dict[tuple[str, tuple[int | str, ...]], str] = {}  # (tensor, strides)
        for _, s in walk(specs):
            if isinstance(s, LoopSpec) and isinstance(s.count, str):
                self._symbol(s.count)
        for _, s in walk(specs):  # counts a stride depends on but no loop of the nest runs over
            for a in s.args if isinstance(s, OpSpec) else ():
                for n in stride_symbols(a.tile_strides):
                    self._symbol(n)
        if any(isinstance(s, LoopSpec) for s in specs):  # every loop runs from 0 in steps of 1
            for c in (0, 1):
                self.consts[c] = self.names.fresh(f"c{c}")
        for _, s in walk(specs):
            for a in s.args if isinstance(s, OpSpec) else ():
                _check_addresses(s, a)
            if isinstance(s, LoopSpec) and isinstance(s.count, int) and s.count not in self.consts:
                self.consts[s.count] = self.names.fresh(f"c{s.count}")
            for a in s.args if isinstance(s, OpSpec) else ():
                if _base_key(a) not in self.bases:
                    self.bases[_base_key(a)] = self.names.fresh(f"{a.tensor or 'arg'}_{a.memory}")
                if _moves(a) and (a.tensor, a.tile_strides) not in self.maps:
                    stem, taken = f"#{alias_name('tile_' + (a.tensor or str(a.arg_index)))}", \
                        set(self.maps.values())
                    alias = next(stem if i == 0 else f"{stem}_{i}" for i in itertools.count()
                                 if (stem if i == 0 else f"{stem}_{i}") not in taken)
                    self.maps[(a.tensor, a.tile_strides)] = alias

    def _symbol(self, name: str) -> None:
        if name not in self.symbols:
            self.symbols[name] = self.names.fresh(name)

    def header(self, name: str) -> list[str]:
        lines = [f"{alias} = {address_map(strides)}" for (_, strides), alias in self.maps.items()]
        args = ", ".join(f"{v}: index" for v in self.symbols.values())
        lines.append(f"func.func @{symbol_name(name)}({args}) {{")
        lines += [f"{INDENT}{v} = arith.constant {c} : index" for c, v in self.consts.items()]
        lines += [f"{INDENT}{v} = arith.constant {address} : index  // {tensor} {memory}"
                  for (memory, tensor, address), v in self.bases.items()]
        return lines

    def body(self, items: tuple[Spec, ...], indices: list[str]) -> Iterator[str]:
        pad = INDENT * (len(indices) + 1)
        applied: dict[tuple[str, tuple[int | str, ...], str], str] = {}  # addresses in block
        for s in items:
            if isinstance(s, LoopSpec):
                idx = self.names.fresh(f"i{len(indices)}")
                bound = self.symbols[s.count] if isinstance(s.count, str) \
                    else self.consts[s.count]
                yield f"{pad}scf.for {idx} = {self.consts[0]} to {bound} step {self.consts[1]} {{"
                yield from self.body(s.body, [*indices, idx])
                yield f"{pad}}}"
                continue
            values = []
            for a in s.args:
                base = self.bases[_base_key(a)]
                if not _moves(a):
                    values.append(base)
                    continue
                if len(a.tile_strides) != len(indices):
                    raise EmitError(f"op {s.name or s.op!r}: tensor {a.tensor!r} has tile "
                                    f"strides for {len(a.tile_strides)} loop levels but sits in "
                                    f"{len(indices)}")
                key = (a.tensor, a.tile_strides, base)
                if key not in applied:
                    applied[key] = self.names.fresh(f"{a.tensor or 'arg'}_tile")
                    syms = ", ".join([base, *(self.symbols[n]
                                              for n in stride_symbols(a.tile_strides))])
                    yield (f"{pad}{applied[key]} = affine.apply "
                           f"{self.maps[(a.tensor, a.tile_strides)]}({', '.join(indices)})"
                           f"[{syms}]")
                values.append(applied[key])
            yield f"{pad}{_execute(s, values)}"


def _check_addresses(op: OpSpec, a: TensorArg) -> None:
    """The base address and tile strides of ``a`` fit MLIR's 64-bit ``index``."""
    where = f"op {op.name or op.op!r}: tensor {a.tensor!r}"
    check_index(a.address, f"{where}: its {a.memory} address")
    for s in a.tile_strides:
        if isinstance(s, int):
            check_index(s, f"{where}: its tile stride in bytes")


def _base_key(a: TensorArg) -> tuple[str, int | str, int]:
    return (a.memory, a.tensor or a.arg_index, a.address)


def render_bundle(specs: tuple[Spec, ...], name: str = "bundle", unrolled: bool = False) -> str:
    """MLIR text of the loop bundle of ``specs`` (a LoopSpec program) in function ``@name``."""
    if unrolled:
        return _render_unrolled(specs, name)
    rolled = _Rolled(specs)
    lines = [*rolled.header(name), *rolled.body(specs, []), f"{INDENT}return", "}"]
    return "\n".join(lines) + "\n"


def _launches(specs: tuple[Spec, ...]) -> int:
    """How many launches unrolling ``specs`` lists (symbolic counts raise in ``_iterations``)."""
    total = 0
    for s in specs:
        if isinstance(s, OpSpec):
            total += 1
        elif isinstance(s.count, int):
            total += s.count * _launches(s.body)
    return total


def _iterations(specs: tuple[Spec, ...], indices: tuple[int, ...]
                ) -> Iterator[tuple[OpSpec, tuple[int, ...]]]:
    """Every launch of the nest in order, with the loop indices it runs at."""
    for s in specs:
        if isinstance(s, OpSpec):
            yield s, indices
            continue
        if isinstance(s.count, str):
            raise EmitError(f"cannot unroll a loop of symbolic count {s.count!r}; emit the "
                            "rolled bundle instead, or give the count a number")
        for i in range(s.count):
            yield from _iterations(s.body, (*indices, i))


def _render_unrolled(specs: tuple[Spec, ...], name: str) -> str:
    count = _launches(specs)
    if count > MAX_UNROLLED_LAUNCHES:
        raise EmitError(f"unrolling {name!r} lists {count} launches, more than "
                        f"{MAX_UNROLLED_LAUNCHES}; emit the rolled bundle instead")
    launches = []
    consts: dict[int, str] = {}
    for op, indices in _iterations(specs, ()):
        values = []
        for a in op.args:
            _check_addresses(op, a)
            address = a.address
            if _moves(a):
                if stride_symbols(a.tile_strides):
                    raise EmitError(f"cannot unroll: tensor {a.tensor!r} of op {op.name!r} "
                                    f"moves by symbolic strides {a.tile_strides}")
                address += sum(int(s) * i for s, i in zip(a.tile_strides, indices, strict=True))
            check_index(address, f"op {op.name or op.op!r}: tensor {a.tensor!r}: its address at "
                        f"iteration {list(indices)}")
            values.append(consts.setdefault(address, f"%c{address}"))
        launches.append((op, indices, values))
    lines = [f"func.func @{symbol_name(name)}() {{"]
    lines += [f"{INDENT}{v} = arith.constant {c} : index" for c, v in sorted(consts.items())]
    for op, indices, values in launches:
        where = f"  // iteration {list(indices)}" if indices else ""
        lines.append(f"{INDENT}{_execute(op, values)}{where}")
    lines += [f"{INDENT}return", "}"]
    return "\n".join(lines) + "\n"
