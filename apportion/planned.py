"""``ap.plan``: a program planned for a target, the value users hold, with its emitters and runs.

>>> import apportion as ap
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> planned.op("add").cores, [g.counts for g in planned.groups]
(8, [(2, 4)])
>>> all(c.ok for c in planned.check())
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from apportion.errors import ExecutionError, PlanningError, ProgramError, TargetError
from apportion.ir.program import Program
from apportion.limits import cite
from apportion.passes.pipeline import Stage
from apportion.passes.pipeline import plan as run_pipeline
from apportion.passes.split_k import rewrite_as_planned
from apportion.passes.strategy import Strategy, parse_strategy
from apportion.plans.memory import Buffer, GroupPlan
from apportion.plans.plan import OpPlan, Plan
from apportion.target.presets import PRESETS, spyre
from apportion.target.split_k import Resolver
from apportion.target.target import Target

if TYPE_CHECKING:
    from apportion.runtime.reference import OutputCheck
    from apportion.schedule.loopspec_values import SpecProgram
    from apportion.schedule.values import Schedule


@dataclass(frozen=True)
class PlannedProgram:
    """A program, the target it was planned for, and its plan.

    ``lowered`` is the plan lowered once (the schedule every emitter renders) and
    ``schedule(sizes, params)`` the schedule of a run, bound from it at run-time sizes and
    symbolic loop counts (by substitution: no planning pass runs again), once per binding.
    ``run`` hands that schedule to a backend (``apportion.backends``: the reference runs it
    core by core, loop nests iteration by iteration in simulated memory; ``backend="iree"``
    compiles its parallel IR), ``check`` compares a run with the unplanned program,
    ``loopspec``/``bundle_mlir``/``forall_mlir`` emit it, ``to_json`` prints plan format v1
    and ``from_json`` reads it back.
    """

    program: Program
    target: Target
    plan: Plan
    #: the program as the user gave it, where planning rewrote it (split-K ops as partial and
    #: combine ops; ``program`` is then the rewritten one): what ``check`` runs unplanned
    source: Program | None = None

    def __post_init__(self) -> None:
        if self.plan.program != self.program.name or [o.name for o in self.plan.ops] != [
                o.name for o in self.program.ops]:
            raise PlanningError(f"plan of {self.plan.program!r} does not fit program "
                                f"{self.program.name!r}: its ops differ")
        if (self.plan.target, self.plan.cores) != (self.target.name, self.target.cores):
            raise PlanningError(f"plan is for target {self.plan.target!r} with "
                                f"{self.plan.cores} cores, not {self.target.name!r} with "
                                f"{self.target.cores}")

    # -- what was decided -----------------------------------------------------------------------

    def op(self, name: str) -> OpPlan:
        """The plan of op ``name``."""
        if not isinstance(name, str):
            raise PlanningError(f"op: name must be an op name (a str), got {_describe(name)}")
        return self.plan.op(name)

    @property
    def ops(self) -> tuple[OpPlan, ...]:
        return self.plan.ops

    @property
    def groups(self) -> tuple[GroupPlan, ...]:
        """The loop groups (coarse tiling) with their scratchpad plans."""
        return self.plan.groups

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return self.plan.buffers

    # -- formats and emitters -------------------------------------------------------------------

    def to_json(self) -> str:
        """Plan format v1 (JSON)."""
        from apportion.plans.serialize import to_json

        return to_json(self.plan)

    @staticmethod
    def from_json(text: str, program: Any, target: Target | None = None) -> PlannedProgram:
        """Read plan format v1 back for ``program``; without ``target``, the preset the plan
        names is used with its core count (a plan for a TOML target needs the target given)."""
        from apportion.plans.serialize import from_json

        if not isinstance(text, str | bytes | bytearray):
            raise PlanningError(f"PlannedProgram.from_json: text must be plan JSON (a str), got "
                                f"{_describe(text)}")
        plan = from_json(text)
        if target is None:
            if plan.target not in PRESETS:
                raise TargetError(f"plan is for target {plan.target!r}, not a preset "
                                  f"({', '.join(PRESETS)}): pass the target it was made for")
            target = PRESETS[plan.target](plan.cores)
        given = _program(program, "PlannedProgram.from_json")
        target = _target(target, "PlannedProgram.from_json")
        split = {o.name: o.split_k for o in plan.ops if o.split_k is not None}
        if dict(plan.symbols) != given.planning_sizes():
            raise PlanningError(f"plan was made at symbol sizes {dict(plan.symbols)}; program "
                                f"{given.name!r} plans at {given.planning_sizes()}")
        planned = rewrite_as_planned(given.bind(), target, split)
        return PlannedProgram(planned, target, plan, None if planned is given else given)

    def at(self, sizes: Mapping[str, int]) -> PlannedProgram:
        """This plan at run-time ``sizes`` of its symbols: a PlannedProgram with static shapes
        (what the LoopSpec and loop bundle emitters need: they launch concrete slices)."""
        sizes = _mapping(sizes, "at: sizes", ExecutionError)
        program, plan = self.bound(sizes)
        return PlannedProgram(program, self.target, plan, self.given.bind(sizes))

    def _static(self, what: str) -> None:
        if self.symbols:
            raise PlanningError(f"program {self.program.name!r} has run-time sizes "
                                f"({', '.join(self.symbols)}); {what} launches concrete slices: "
                                f"bind them first with .at({{{self.symbols[0]!r}: n}}) "
                                "(the forall form covers every size) "
                                f"{cite('bundle-static-sizes')}")

    def loopspec(self) -> SpecProgram:
        """The plan as nested LoopSpec / OpSpec values, ops outside loops bare, in program order.

        >>> import apportion as ap
        >>> planned = ap.plan(ap.load("examples/fused.json"), target=ap.targets.spyre(cores=32))
        >>> [s.count for s in planned.loopspec()]
        [2]
        """
        from apportion.backends.bundle.loopspec import from_schedule

        self._static("the LoopSpec program")
        return from_schedule(self.lowered, self.target)

    def bundle_mlir(self, unrolled: bool = False) -> str:
        """The loop bundle as MLIR text, checked to parse and verify: ``scf.for`` loops of
        ``"apportion.execute"`` launches (``unrolled``: every iteration with constant
        addresses)."""
        from apportion.mlir.builder import verify_mlir
        from apportion.mlir.bundle import render_bundle

        self._static("the loop bundle")
        text = render_bundle(self.loopspec(), self.program.name, unrolled=unrolled)
        verify_mlir(text)
        return text

    def forall_mlir(self) -> str:
        """The plan as thread-first parallel IR on tensors (MLIR text), checked to parse and
        verify: one ``scf.forall`` over each op's core grid, ``scf.for`` loops around the
        foralls of a loop group's tile (``mlir.forall``); one function for every run-time
        size (``mlir.forall_sizes``)."""
        from apportion.mlir.forall import forall_mlir, verify_mlir

        text = forall_mlir(self.lowered)
        verify_mlir(text)
        return text

    # -- lowering -------------------------------------------------------------------------------

    @cached_property
    def lowered(self) -> Schedule:
        """The plan lowered once (``schedule.lower``): at the planning sizes, the program as
        given recorded where it has run-time sizes, and the symbolic loop counts at their
        planned values (``planned_counts``): what every emitter renders, one function for
        every size and count.

        >>> import apportion as ap
        >>> planned = ap.plan(ap.load("examples/dynamic_k.json"), ap.targets.spyre(cores=8))
        >>> planned.lowered.sizes, planned.lowered is planned.lowered
        ((('K', 65536),), True)
        """
        from apportion.schedule.lower import lower, planned_counts

        return lower(self.program, self.plan, self.target,
                     params=planned_counts(self.plan) or None,
                     given=self.given if self.symbols else None)

    @cached_property
    def _schedules(self) -> dict[tuple[tuple[tuple[str, int], ...], ...], Schedule]:
        return {}

    def schedule(self, sizes: Mapping[str, int] | None = None,
                 params: Mapping[str, int] | None = None) -> Schedule:
        """The schedule of a run at run-time ``sizes`` of the symbols (default: the planning
        sizes) and symbolic loop counts ``params``: ``lowered`` bound by substitution
        (``schedule.bind``; no planning pass runs again), once per binding. Its ``unbound``
        is ``lowered`` where they differ. Raises ExecutionError for sizes or counts the plan
        cannot take (out of bounds, unbound, a split-K cut into parts of units).

        >>> import apportion as ap
        >>> planned = ap.plan(ap.load("examples/dynamic_k.json"), ap.targets.spyre(cores=8))
        >>> s = planned.schedule({"K": 4096})
        >>> s.program.tensor("x").shape, s.unbound is planned.lowered
        ((32, 4096), True)
        """
        from apportion.schedule.lower import lower

        sizes = _mapping(sizes, "schedule: sizes", ExecutionError)
        params = _mapping(params, "schedule: params", ExecutionError)
        key = (tuple(sorted(sizes.items())), tuple(sorted(params.items())))
        found = self._schedules.get(key)
        if found is None:
            found = lower(self.program, self.plan, self.target, sizes or None, params or None,
                          given=self.given if self.symbols else None)
            module = self.lowered
            if (found.sizes, found.params) == (module.sizes, module.params):
                found = module
            else:
                found = replace(found, unbound=module)
            self._schedules[key] = found
        return found

    # -- running ----------------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, Any] | None = None, threads: int | None = None,
            params: Mapping[str, int] | None = None, backend: str = "reference"
            ) -> dict[str, Any]:
        """Execute the plan on ``backend`` (random inputs unless given); returns the inputs and
        outputs (the reference backend: every tensor held whole) as storage arrays. ``params``
        gives symbolic loop counts (within the target's ``max_loop_count``) and run-time sizes.
        ``backend`` is a name of ``apportion.backends.BACKENDS``: ``reference`` (numpy, core
        slice by core slice; ``threads`` runs an op's cores concurrently), ``torch`` (PyTorch
        kernels on ``threads`` threads) or ``iree`` (the parallel IR compiled by IREE, cached:
        ``backends.iree.runtime``); ``bundle`` emits and ``dtensor`` runs sharding plans, so
        both are refused naming their documented limit (``docs/limits.md``)."""
        from apportion.runtime import random_inputs

        _check_threads(threads)
        if inputs is not None and not isinstance(inputs, Mapping):
            raise ExecutionError(f"run: inputs must be a mapping of input name to array, got "
                                 f"{_describe(inputs)}")
        sizes, counts = self._split_params(params)
        runner = _runner(backend, self)
        if self.symbols and inputs is not None:  # the sizes the inputs' shapes have
            from apportion.schedule.bind import infer_sizes

            sizes = infer_sizes(self.given, inputs, sizes)
        schedule = self.schedule(sizes, counts)
        xs = random_inputs(schedule.program) if inputs is None else inputs
        return runner(schedule, xs, threads=threads)

    @property
    def given(self) -> Program:
        """The program as the user gave it (before split-K rewrites and size binding)."""
        return self.source or self.program

    @property
    def symbols(self) -> tuple[str, ...]:
        """Names of the sizes known only at run time (``--param K=4096`` binds one)."""
        return tuple(self.given.symbol_map)

    def bound(self, sizes: Mapping[str, int] | None = None) -> tuple[Program, Plan]:
        """The program and plan at run-time ``sizes`` of the symbols (default: the planning
        sizes): split-K select chains evaluated, every op's slices cut from the bound sizes."""
        if not self.symbols:
            if sizes:
                raise ExecutionError(f"program {self.program.name!r} has no symbolic sizes; "
                                     f"got {sorted(sizes)}")
            return self.program, self.plan
        from apportion.schedule.bind import bind_plan

        try:
            return bind_plan(self.program, self.plan, self.given, sizes or {},
                             self.target.split_padded_reduction)
        except ProgramError as e:
            raise ExecutionError(str(e)) from None

    def check(self, seed: int = 0, threads: int | None = None,
              params: Mapping[str, int] | None = None, backend: str = "reference"
              ) -> list[OutputCheck]:
        """Run planned (on ``backend``) and unplanned on the same random inputs and compare
        every output (``runtime.check``)."""
        from apportion.runtime.check import expect

        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ExecutionError(f"check: seed must be an int >= 0, got {_describe(seed)}")
        _check_threads(threads)
        sizes, _ = self._split_params(params)
        given = self.given.bind(sizes) if self.symbols else self.given
        want = expect(given, seed)
        return want.compare(self.run(want.inputs, threads=threads, params=params,
                                     backend=backend))

    @property
    def params(self) -> tuple[str, ...]:
        """Names of the symbolic loop counts a run needs values for."""
        return tuple(dict.fromkeys(p for g in self.plan.groups for p in g.params))

    def _split_params(self, params: Mapping[str, int] | None
                      ) -> tuple[dict[str, int], dict[str, int] | None]:
        """``params`` as symbol sizes and symbolic loop counts, each checked."""
        given = _mapping(params, "params", ExecutionError)
        sizes = {k: given.pop(k) for k in list(given) if k in self.symbols}
        self._check_params(given)
        return sizes, given or None

    def _check_params(self, params: Mapping[str, int] | None) -> None:
        given = dict(params or {})
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            valid = ", ".join((*self.params, *self.symbols)) or "none"
            raise ExecutionError(f"{unknown[0]!r} is not a symbolic loop count or size of "
                                 f"{self.program.name!r}; symbolic counts and sizes: {valid}")
        for name, value in given.items():
            if isinstance(value, bool) or not isinstance(value, int) or not (
                    1 <= value <= self.target.max_loop_count):
                raise ExecutionError(f"symbolic loop count {name!r} = {value!r}: must be an "
                                     f"int in 1..{self.target.max_loop_count} (the target's "
                                     "max_loop_count)")


def _describe(value: object) -> str:
    """``value`` for an error message: its repr, cut short, and its type."""
    text = repr(value)
    return f"{text[:57] + '...' if len(text) > 60 else text} ({type(value).__name__})"


def _mapping(value: Any, what: str, error: type[Exception]) -> dict[str, Any]:
    """``value`` (a mapping of names, or None) as a dict, or ``error`` naming ``what``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise error(f"{what} must be a mapping of names to ints (like {{'T': 4}}), got "
                    f"{_describe(value)}")
    return dict(value)


def _check_threads(threads: Any) -> None:
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ExecutionError(f"threads must be None or an int >= 1, got {_describe(threads)}")


def _runner(backend: Any, planned: PlannedProgram) -> Any:
    """The ``run`` of backend ``backend`` (``apportion.backends``: a schedule and inputs in),
    or an error naming the valid names, or the documented limit that stops it (``bundle``
    emits; ``dtensor`` needs a mesh; ``cuda`` a GPU)."""
    from apportion.backends import get, require

    found = get(backend)
    if found.emit is not None:
        raise ExecutionError(f"backend {found.name!r} emits, it does not run: use "
                             f"planned.bundle_mlir() or planned.loopspec() (apportion emit "
                             f"--bundle) {cite('bundle-emits-only')}")
    require(found, planned)  # a backend running meshes only cites what it needs here
    if found.run is None:
        raise ExecutionError(f"backend {found.name!r} runs programs sharded over a mesh "
                             "(run_mesh), not a plan for one device's cores")
    return found.run


def _program(program: Any, where: str) -> Program:
    """The IR program of ``program`` (a Program or a builder), or a clear error."""
    if isinstance(program, Program):
        return program
    built = getattr(program, "program", None)
    if isinstance(built, Program):  # a ProgramBuilder (``with ap.program(...) as p``)
        return built
    hint = ": read a program file with ap.load(path) first" if isinstance(program, str) else ""
    raise ProgramError(f"{where} needs a Program or a builder's program, got "
                       f"{type(program).__name__} {program!r}"[:200] + hint)


def _target(target: Any, where: str) -> Target:
    if isinstance(target, Target):
        return target
    hint = (f": make one with ap.targets.resolve({target!r})" if isinstance(target, str) else
            "")
    raise TargetError(f"{where} needs a Target (ap.targets.spyre(cores=8), "
                      f"ap.targets.load_toml(path)), got {type(target).__name__} "
                      f"{target!r}"[:200] + hint)


def plan(program: Any, target: Target | None = None, strategy: str | Strategy = "balanced",
         auto_tile: bool = False, debug: Stage | None = None,
         split_k: Resolver | None = None) -> PlannedProgram:
    """Plan ``program`` (a Program or a builder's) for ``target`` (default: spyre, 32 cores or
    ``SENCORES``) under ``strategy``: a name (``balanced``, ``greedy``, ``greedy-multiples``) or
    a strategy object of ``ap.strategies`` (``Balanced()``, ``Greedy(rule=...)``); the plan
    records its name. ``auto_tile`` picks each tiling group's loop counts; ``debug(stage,
    value)`` sees every stage's result.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/mlp.json"), target=ap.targets.spyre(cores=8))
    >>> planned.op("act").cores
    8
    >>> old = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8),
    ...               strategy=ap.strategies.Greedy(rule="multiples"))
    >>> old.plan.strategy, old.op("gate").split_map
    ('greedy-multiples', {'m': 8, 'n': 1, 'k': 1})
    """
    prog = _program(program, "ap.plan")
    tgt = spyre() if target is None else _target(target, "ap.plan")
    chosen = parse_strategy(strategy)
    if not isinstance(auto_tile, bool):
        raise PlanningError(f"auto_tile must be True or False, got {auto_tile!r}")
    if debug is not None and not callable(debug):
        raise PlanningError(f"debug must be None or a callable (stage name, value), got "
                            f"{_describe(debug)}")
    if split_k is not None and not callable(split_k):
        raise PlanningError(f"split_k must be a callable (a ReductionShape in, slices or None "
                            f"out), got {type(split_k).__name__}")
    result = run_pipeline(prog, tgt, chosen, debug, auto_tile, split_k=split_k)
    if result.rewritten is not None:  # split-K ops became partial and combine ops
        return PlannedProgram(result.rewritten, tgt, result, prog)
    if prog.symbols:  # planned at its planning sizes
        return PlannedProgram(prog.bind(), tgt, result, prog)
    return PlannedProgram(prog, tgt, result)
