"""Run-time sizes in the parallel IR (``mlir.forall``): the size of every op dim and tensor
axis as an index expression: constants for a static program, and for a program with symbolic
sizes (``"shape": [32, "K"]``) the values one function computes for every size.

A symbol's size is read from the first input that has it (``tensor.dim``), or, where no input
has it, taken as a trailing ``index`` argument named after it. A split-K op planned with a
select chain (``target.split_k.SelectChain``) gets its slice count F from the run-time
reduction size K: a chain of ``arith.select``, built from the last case backwards so that the
first case holding K wins (``lo <= K``, ``K <= hi`` and ``K % multiple == 0`` as
``arith.cmpi``/``arith.remui``/``arith.andi``), the default last; the slice length is
``step = K / F`` (``arith.divui``). The partial op's iteration space is then [F, ..., step] and
its partials tensor ``tensor<?x...>``. A split of several reduction dims (each its own slice
dim, ``SplitK.factors``) cuts each as a static split of one dim does. Where ``step`` is known
only at run time, an input read
at ``step * s + k`` along K is read through a ``tensor.expand_shape`` of that axis into
``[F, step]`` (an indexing map cannot multiply a dim by a run-time value): slice ``s`` of the
view starts at element ``step * s`` of K.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from apportion.errors import EmitError
from apportion.ir.affine import AffineExpr
from apportion.ir.op import Access, Op
from apportion.ir.program import Program
from apportion.limits import cite
from apportion.mlir.builder import Block, SsaNames
from apportion.mlir.forall.tensors import TensorVal
from apportion.mlir.index import Ix
from apportion.plans.plan import SplitK
from apportion.target.split_k import SelectChain


@dataclass(frozen=True)
class Cut:
    """A split-K op's run-time cut: the base op's reduction dim ``dim`` of ``size`` elements
    into ``slices`` slices (dim ``s`` of its partial and combine ops) of ``step`` elements (dim
    ``k`` of its partial op)."""

    base: str
    dim: str
    s: str
    k: str
    size: Ix
    slices: Ix
    step: Ix


@dataclass(frozen=True)
class View:
    """Input ``index`` of an op read through a ``tensor.expand_shape`` of its ``axis`` (the
    split reduction dim, of ``size`` elements) into ``[slices, step]``; ``access`` reads the
    expanded tensor."""

    index: int
    axis: int
    size: Ix
    slices: Ix
    step: Ix
    access: Access


class Sizes:
    """Op -> dim -> size, and tensor -> shape, as index expressions of the emitted function;
    constants for a static program."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.given: Program | None = None
        self.dims: dict[str, dict[str, Ix]] = {
            op.name: {d: Ix(n) for d, n in op.dims} for op in program.ops}
        self.shapes: dict[str, tuple[Ix, ...]] = {
            t.name: tuple(Ix(n) for n in t.shape) for t in program.tensors}
        #: partial and combine op -> its cuts, one per reduction dim split
        self.cuts: dict[str, tuple[Cut, ...]] = {}
        #: symbol -> its SSA value
        self.symbols: dict[str, str] = {}
        #: the symbols no input has: the function takes them as ``index`` arguments
        self.arguments: list[str] = []

    @staticmethod
    def symbolic(program: Program, given: Program, names: SsaNames) -> Sizes:
        """The sizes of ``program`` (``given`` planned, at its planning sizes) with every
        tensor of ``given`` shaped by its symbols' SSA values (named here); ``read`` and
        ``cut`` then define those values and size the ops."""
        sizes = Sizes(program)
        sizes.given = given
        for sym in given.symbols:
            sizes.symbols[sym.name] = names.fresh(sym.name)
        for t in given.tensors:
            syms = t.symbols
            sizes.shapes[t.name] = tuple(Ix.atom(sizes.symbols[syms[i]]) if i in syms else Ix(n)
                                         for i, n in enumerate(t.shape))
        return sizes

    def of(self, op: Op) -> dict[str, Ix]:
        return self.dims[op.name]

    def shape(self, tensor: str) -> tuple[Ix, ...]:
        return self.shapes[tensor]

    # -- defining the run-time sizes ------------------------------------------------------

    def read(self, blk: Block, inputs: Mapping[str, TensorVal]) -> None:
        """Emit ``tensor.dim`` of the first input that has each symbol; the others become
        arguments."""
        assert self.given is not None
        done: set[str] = set()
        for name in self.given.inputs:
            for axis, sym in self.given.tensor(name).dynamic:
                if sym in done:
                    continue
                val = inputs[name]
                blk.emit(f"{self.symbols[sym]} = tensor.dim {val.ssa}, {blk.value(axis)} : "
                         f"{val.type}")
                done.add(sym)
        self.arguments = [s for s in self.symbols if s not in done]

    def cut(self, blk: Block, split_k: Mapping[str, SplitK]) -> None:
        """Size every op: the given ops by their symbols, split-K partial and combine ops by
        their cut (slices and step emitted into ``blk``; ``split_k``: op name -> the split
        its launch records, ``schedule.values.Launch.split_k``), and the partials tensors."""
        given, program = self.given, self.program
        assert given is not None
        value = {s: Ix.atom(v) for s, v in self.symbols.items()}

        def base_sizes(name: str) -> dict[str, Ix]:
            syms = given.dim_symbols[name]
            return {d: value[syms[d]] if d in syms else Ix(n) for d, n in given.op(name).dims}

        for op in program.ops:
            if op.name in given.op_map:
                self.dims[op.name] = base_sizes(op.name)
                continue
            stem, _, role = op.name.rpartition(".")
            if role not in ("partial", "combine") or stem not in given.op_map:
                # a copy the relayout pass added reads a tensor of the given program whole,
                # one dim per axis: its dims are that tensor's (run-time) sizes
                read = self._read_alone(op)
                if read is None:
                    raise EmitError(f"op {op.name!r} is neither an op of program "
                                    f"{given.name!r}, a split-K partial or combine op of one, "
                                    "nor an op reading each of its dims alone from a tensor "
                                    "of it")
                self.dims[op.name] = read
                continue
            cs = self.cuts.get(f"{stem}.partial") or self.cuts.get(f"{stem}.combine")
            if cs is None:
                cs = self._cuts(blk, split_k, stem, base_sizes(stem))
            self.cuts[op.name] = cs
            sizes = base_sizes(stem)
            for c in cs:
                sizes.update({c.s: c.slices, c.k: c.step})
            self.dims[op.name] = {d: sizes[d] for d in op.dim_names}
        for op in program.ops:  # tensors the rewrite made (partials): as their producer writes
            t = op.out.tensor
            if t not in given.tensor_map:
                self.shapes[t] = tuple(
                    self.dims[op.name][e.single_dim] if e.single_dim else Ix(n)
                    for e, n in zip(op.out.index, program.tensor(t).shape, strict=True))

    def _read_alone(self, op: Op) -> dict[str, Ix] | None:
        """``op``'s dims sized by the inputs of the given program it reads, each dim from an
        axis it indexes alone (None: a dim no such axis sizes)."""
        assert self.given is not None
        found: dict[str, Ix] = {}
        for acc in op.ins:
            if acc.tensor not in self.given.tensor_map:
                continue
            for e, n in zip(acc.index, self.shapes[acc.tensor], strict=True):
                if e.single_dim is not None:
                    found.setdefault(e.single_dim, n)
        if any(d not in found for d in op.dim_names):
            return None
        return {d: found[d] for d in op.dim_names}

    def _cuts(self, blk: Block, split_k: Mapping[str, SplitK], stem: str,
              base: Mapping[str, Ix]) -> tuple[Cut, ...]:
        """The cuts of op ``stem``'s partial op: one per reduction dim its split cuts, in the
        order of the partial's slice dims."""
        partial = self.program.op(f"{stem}.partial")
        split = split_k.get(partial.name)
        slice_dims = tuple(e.single_dim for e in partial.out.index[:len(split.dims)]
                           ) if split is not None else ()
        new = [d for d in partial.dim_names if d not in base]
        gone = [d for d in base if d not in partial.sizes]
        if split is None or len(new) != 2 * len(gone) or len(gone) != len(split.dims) or \
                not all(slice_dims) or (split.select is not None and len(gone) > 1):
            raise EmitError(f"op {partial.name!r} does not cut reduction dims of {stem!r} into "
                            "the slices its schedule records")
        # the partials tensor's leading axes are the slice dims, in the split's order
        per = dict(zip(slice_dims, split.factors or (split.factor,), strict=True))
        cuts = []
        for d in gone:
            s, k = self._slice_dims(partial, stem, d, slice_dims)
            cuts.append(self._cut(blk, split, stem, d, s, k, base[d],
                                  per[s] if len(gone) > 1 else None))
        return tuple(sorted(cuts, key=lambda c: slice_dims.index(c.s)))

    def _slice_dims(self, partial: Op, stem: str, d: str, slice_dims: tuple[str | None, ...]
                    ) -> tuple[str, str]:
        """The partial op's slice dim and offset dim of the base op's cut dim ``d``: the two
        dims a read of ``d`` became (``step * s + k``), the slice dim the one the partials
        tensor is indexed by."""
        assert self.given is not None
        base = self.given.op(stem)
        for a, b in zip(partial.ins, base.ins, strict=True):
            for ea, eb in zip(a.index, b.index, strict=True):
                if not eb.coeff(d):
                    continue
                made = [x for x in ea.dims if x not in eb.dims]
                s = [x for x in made if x in slice_dims]
                if len(made) == 2 and len(s) == 1:
                    return s[0], next(x for x in made if x != s[0])
        raise EmitError(f"op {partial.name!r}: no read of its cut reduction dim {d!r} of "
                        f"{stem!r} as a slice and an offset in it")

    @staticmethod
    def _cut(blk: Block, split: SplitK, stem: str, dim: str, s: str, k: str, size: Ix,
             factor: int | None) -> Cut:
        """Dim ``dim`` of ``size`` cut into slices (``factor``; None: the split's one factor,
        or its select chain's choice at the run-time size) of ``step`` elements."""
        if split.select is not None and factor is None:
            slices = select(blk, split.select, size, f"{stem}_slices")
        else:
            slices = Ix(split.factor if factor is None else factor)
        if slices.is_const:
            step = size.floordiv(slices.value)
            if not step.is_const and step.ssa is None:
                step = Ix.atom(blk.value(step, f"{stem}_step"))
        else:
            name = blk.fresh(f"{stem}_step")
            blk.emit(f"{name} = arith.divui {blk.value(size)}, {blk.value(slices)} : index")
            blk.builder.defs[name] = lambda env: size.evaluate(env) // slices.evaluate(env)
            step = Ix.atom(name)
        return Cut(stem, dim, s, k, size, slices, step)

    # -- reading a run-time cut ---------------------------------------------------------

    def views(self, op: Op) -> list[View]:
        """The inputs of ``op`` read through an expanded axis: those of a partial op whose
        slice length is known only at run time, along the reduction dim it cuts."""
        out = []
        for c in self.cuts.get(op.name, ()):
            if not c.step.is_const and c.k in op.sizes:
                out += self._views(op, c)
        return out

    def _views(self, op: Op, c: Cut) -> list[View]:
        assert self.given is not None
        base = self.given.op(c.base)
        out = []
        for i, (a, b) in enumerate(zip(op.ins, base.ins, strict=True)):
            axes = [j for j, e in enumerate(b.index) if e.coeff(c.dim)]
            if not axes:
                continue
            j = axes[0]
            if len(axes) > 1 or b.index[j].single_dim != c.dim:
                raise EmitError(f"op {c.base!r}: its reduction dim {c.dim!r} is split at run "
                                f"time, but input {b} reads it through "
                                f"{b.index[axes[-1]].to_source()!r}; a run-time split reads "
                                "only an axis that the dim indexes alone "
                                f"{cite('iree-runtime-split-read')}")
            index = (*a.index[:j], AffineExpr.dim(c.s), AffineExpr.dim(c.k), *a.index[j + 1:])
            out.append(View(i, j, c.size, c.slices, c.step, Access(a.tensor, index)))
        return out


def select(blk: Block, chain: SelectChain, k: Ix, stem: str) -> Ix:
    """The slices ``chain`` gives the run-time size ``k``: a chain of ``arith.select`` built
    from its last case backwards (the first case holding ``k`` wins), the default last."""
    if k.is_const:
        return Ix(chain.evaluate(k.value))
    kv = blk.value(k)
    # a comparison or a conjunction several cases share is made once
    tests: dict[tuple[str, int], str] = {}
    ands: dict[tuple[str, str], str] = {}

    def test(what: str, bound: int) -> str:
        if (what, bound) not in tests:
            c = blk.fresh(f"{stem}_{what}{bound}")
            if what == "mul":
                r = blk.fresh(f"{stem}_rem{bound}")
                blk.emit(f"{r} = arith.remui {kv}, {blk.value(bound)} : index")
                blk.emit(f"{c} = arith.cmpi eq, {r}, {blk.value(0)} : index")
            else:
                blk.emit(f"{c} = arith.cmpi {'uge' if what == 'ge' else 'ule'}, {kv}, "
                         f"{blk.value(bound)} : index")
            tests[what, bound] = c
        return tests[what, bound]

    factor: Ix = Ix(chain.default)
    for i in reversed(range(len(chain.cases))):
        case = chain.cases[i]
        conds = ([test("ge", case.lo)] if case.lo is not None and case.lo > 1 else []) + (
            [test("le", case.hi)] if case.hi is not None else []) + (
            [test("mul", case.multiple)] if case.multiple > 1 else [])
        if not conds:  # the case holds for every size: the cases after it are never reached
            factor = Ix(case.factor)
            continue
        cond = conds[0]
        for other in conds[1:]:
            if (cond, other) not in ands:
                both = blk.fresh(f"{stem}_and")
                blk.emit(f"{both} = arith.andi {cond}, {other} : i1")
                ands[cond, other] = both
            cond = ands[cond, other]
        name = blk.fresh(stem if i == 0 else f"{stem}_case{i}")
        blk.emit(f"{name} = arith.select {cond}, {blk.value(case.factor)}, "
                 f"{blk.value(factor)} : index")
        factor = Ix.atom(name)
    if factor.is_const:
        return factor
    assert factor.ssa is not None
    blk.builder.defs[factor.ssa] = lambda env: chain.evaluate(k.evaluate(env))
    return factor
