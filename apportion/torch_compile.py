"""``ap.backend``: apportion as a ``torch.compile`` backend.

``torch.compile(model, backend=ap.backend(target="spyre", cores=8))`` hands every graph
TorchDynamo captures to the backend, which lowers it (``frontend.torch_export.from_torch``),
plans it (``ap.plan``) and returns a callable that runs the plan core slice by core slice with
torch kernels on a thread pool (``backends.torch.executor``). The graph's constants (lifted
parameters, buffers, scalars) become torch tensors once; each call binds the graph's inputs to
the program's, runs the plan and returns torch tensors in the graph's output structure.

A graph with ATen nodes apportion cannot lower is split at them, as Inductor's fallbacks do:
the graph is exported and decomposed to core ATen ops, the nodes a partial lowering
(``from_torch(..., partial=True)``) leaves out are flagged, and the graph is cut into maximal
subgraphs of one flag each (a node joins its operands' subgraph unless their flags differ, so
supported nodes that do not depend on an unsupported one share a subgraph). Each supported
subgraph is lowered, planned and run like a whole graph; the unsupported ones run eagerly in
between, and inputs the graph mutates (a functionalized ``index_copy_`` into a static KV cache)
are written back. The share (ATen nodes planned, and eager) is said once per graph on the
``apportion`` logger and kept in ``Graph``.

A graph torch made symbolic (dynamo's automatic dynamic shapes: its sizes are ``SymInt``
inputs, e.g. the growing length of a KV cache in ``generate``) is planned at each size it is
called with (the ints bound as constants, one plan per binding, at most
``_Specializing.limit``), so prefill and every decode step run planned.

A graph apportion cannot take otherwise (a plan that does not fit, inputs that need gradients,
no supported node at all) runs eagerly (``gm.forward``) with exactly one record on the
``apportion`` logger saying why; so does a graph (or a planned part of a split graph) whose run
fails, from then on. No apportion error reaches the user's model. The backend keeps what became
of each graph in ``graphs`` (``Graph``: the planned program; or the planned parts and the share
of a split graph; or the reason it ran eagerly; and the sizes a symbolic graph was planned
at).

Inference only: where autograd is on and an input needs its gradient, the graph runs eagerly,
since the plan's results carry no autograd history.

bfloat16 and float16 graphs (and graphs mixing them with float32) run in their dtypes: each
tensor is held in torch's own dtype, each op computes in float32 and rounds its result to its
dtype, as eager PyTorch's kernels do, so results agree with eager to a few of that dtype's
epsilons at the output's scale (``reference.eager_tolerance``).

torch is imported when a graph is compiled, not with this module (``ap.backend`` itself is
imported on first use, so ``import apportion`` imports no torch).

>>> import torch, apportion as ap                                            # doctest: +SKIP
>>> model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU()).eval()  # doctest: +SKIP
>>> fast = torch.compile(model, backend=ap.backend(target="spyre", cores=8))    # doctest: +SKIP
>>> with torch.no_grad():                                                    # doctest: +SKIP
...     y = fast(torch.randn(16, 64))
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from apportion.errors import ApportionError, ExecutionError, ProgramError
from apportion.passes.strategy import Strategy, parse_strategy
from apportion.planned import PlannedProgram, plan
from apportion.target.presets import resolve
from apportion.target.target import Target

__all__ = ["CompileBackend", "Graph", "backend"]

#: the logger a graph that runs eagerly is reported on
log = logging.getLogger("apportion")

#: the core count of a preset named without one
DEFAULT_CORES = 8


@dataclass(frozen=True)
class Graph:
    """What became of one captured graph: ``planned`` when apportion runs it whole, else the
    ``reason`` it runs eagerly, in all or in part. A graph split at unsupported nodes has its
    planned subgraphs in ``parts`` and counts its ATen nodes in ``nodes_planned`` and
    ``nodes_eager`` (``getitem`` nodes, which pick one result of another, are not counted).

    >>> Graph(None, "aten.i0.default: no lowering", parts=(), nodes_planned=6,
    ...       nodes_eager=1).share
    0.8571428571428571
    """

    planned: PlannedProgram | None
    reason: str | None = None
    parts: tuple[PlannedProgram, ...] = ()
    nodes_planned: int = 0
    nodes_eager: int = 0
    #: for a graph torch made symbolic, the sizes (its ``SymInt`` inputs) it was planned at
    sizes: tuple[int, ...] = ()

    @property
    def split(self) -> bool:
        """Whether the graph ran in planned parts with eager nodes between them."""
        return bool(self.parts)

    @property
    def share(self) -> float:
        """The share of the graph's ATen nodes that run planned (1.0 for a whole plan, 0.0 for
        a graph that runs eagerly)."""
        if self.planned is not None:
            return 1.0
        total = self.nodes_planned + self.nodes_eager
        return self.nodes_planned / total if total else 0.0


class CompileBackend:
    """A ``torch.compile`` backend: ``backend(gm, example_inputs)`` returns the callable that
    runs the graph (see the module docstring). Made by ``ap.backend``."""

    def __init__(self, target: Target, strategy: Strategy, threads: int | None) -> None:
        self.target = target
        self.strategy = strategy
        self.threads = threads
        self.graphs: list[Graph] = []

    def __repr__(self) -> str:
        return (f"ap.backend(target={self.target.name!r}, cores={self.target.cores}, "
                f"strategy={self.strategy.name!r}, threads={self.threads})")

    def __call__(self, gm: Any, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        import torch

        if not all(isinstance(x, torch.Tensor) for x in example_inputs):
            return _Specializing(self, gm)
        # outside dynamo's tracing and compile contexts: torch.export of the graph would
        # otherwise pick up dynamo's guards (code naming its frame's locals, ``L['self']``)
        with torch._guards.tracing(None), torch._guards.compile_context(None):
            return self._take(gm, list(example_inputs))

    def _take(self, gm: Any, example_inputs: list[Any], sizes: tuple[int, ...] = ()
              ) -> Callable[..., Any]:
        """The run of one graph of static shapes: planned whole, split at the nodes apportion
        cannot lower, or eager; recorded in ``graphs`` (at ``sizes``) and said once on the
        ``apportion`` logger unless planned whole."""
        from apportion.frontend.torch_program import UnsupportedNodes

        try:
            _check_inputs(example_inputs)
            try:
                run, planned = self._compile(gm, example_inputs)
            except UnsupportedNodes as e:  # split at them: the rest planned, they run eagerly
                run, graph = self._split(gm, example_inputs, e)
                graph = dataclasses.replace(graph, sizes=sizes)
                self.graphs.append(graph)
                log.warning("apportion: split the graph at %d unsupported ATen node%s (%s): "
                            "%d of %d ATen nodes (%.1f%%) run planned in %d part%s, %d "
                            "eagerly", len(e.unsupported), "s" if len(e.unsupported) != 1
                            else "", graph.reason, graph.nodes_planned,
                            graph.nodes_planned + graph.nodes_eager, 100 * graph.share,
                            len(graph.parts), "s" if len(graph.parts) != 1 else "",
                            graph.nodes_eager)
                return run
        except Exception as e:  # anything at all: the model runs eagerly, never fails here
            reason = _reason(e)
            log.warning("apportion: running the graph eagerly: %s", reason)
            self.graphs.append(Graph(None, reason, sizes=sizes))
            return gm.forward
        self.graphs.append(Graph(planned, sizes=sizes))
        return run

    def _split(self, gm: Any, example_inputs: list[Any], refused: Any
               ) -> tuple[Callable[..., Any], Graph]:
        """Split ``gm`` (whose lowering ``refused`` naming its unsupported nodes) into maximal
        subgraphs of supported and of unsupported ATen nodes; plan and run the supported ones
        (``_compile``), the others eagerly. A supported subgraph that does not plan runs
        eagerly too (its nodes counted as eager)."""
        import torch
        from torch.fx.passes.split_module import split_module

        from apportion.frontend.torch_graph import lower_exported
        from apportion.frontend.torch_program import UnsupportedNodes

        ep = torch.export.export(gm, tuple(example_inputs)).run_decompositions()
        try:  # every unsupported node of this export (a partial lowering lists them)
            found = lower_exported(ep, "graph", partial=True).unsupported
        except UnsupportedNodes as e:  # also where a graph output is such a node's result
            found = e.unsupported
        eager_nodes = {u.origin.node for u in found}
        counted = {n.name for n in ep.graph.nodes
                   if n.op == "call_function" and n.target is not operator.getitem}
        part_of = _partition(ep.graph_module.graph, eager_nodes)
        split = split_module(ep.graph_module, ep.graph_module, lambda n: part_of[n.name],
                             keep_original_order=True, tuple_return=True)
        members: dict[str, list[str]] = {}
        for name, key in part_of.items():
            members.setdefault(f"submod_{key}", []).append(name)
        flat = _flat_inputs(ep)

        # run the split graph once on the example inputs: each subgraph's example inputs
        seen: dict[str, list[Any]] = {}

        class Capture(torch.fx.Interpreter):
            def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
                seen[target] = list(args)
                return super().call_module(target, args, kwargs)

        with torch.no_grad():
            Capture(split).run(*flat(example_inputs))

        class Planned(torch.nn.Module):  # a subgraph's planned run, in place of its module
            def __init__(self, run: Callable[..., Any]) -> None:
                super().__init__()
                self.run = run

            def forward(self, *args: Any) -> Any:
                return self.run(*args)

        parts: list[PlannedProgram] = []
        planned_nodes = 0
        for target, args in seen.items():
            names = members.get(target, [])
            if any(n in eager_nodes for n in names):
                continue  # an unsupported subgraph: runs eagerly as split_module built it
            sub = getattr(split, target)
            try:
                run, planned = self._compile(sub, args)
            except Exception as e:  # this part runs eagerly; the graph goes on
                log.info("apportion: a supported part of the graph runs eagerly: %s",
                         _reason(e))
                continue
            setattr(split, target, Planned(run))
            parts.append(planned)
            planned_nodes += sum(1 for n in names if n in counted)
        if not parts:
            raise ProgramError(f"no supported part of the graph plans; {refused.summary}")
        ops = dict.fromkeys(u.origin.target for u in refused.unsupported)
        reason = ", ".join(ops) + (f"; the first: {refused.unsupported[0].origin}: "
                                   f"{refused.unsupported[0].reason}")
        graph = Graph(None, reason, tuple(parts), planned_nodes, len(counted) - planned_nodes)
        return _split_runner(ep, split, flat), graph

    def _compile(self, gm: Any, example_inputs: list[Any]
                 ) -> tuple[Callable[..., Any], PlannedProgram]:
        """Lower, plan and bind one whole graph: its run, and its plan."""
        import torch
        from torch.utils import _pytree as pytree

        from apportion.backends.torch.executor import TorchExecutor
        from apportion.backends.torch.tensors import to_torch_storage
        from apportion.frontend.torch_export import from_torch

        lowered = from_torch(gm, example_inputs)
        if len(lowered.user_inputs) != len(example_inputs):
            raise ProgramError(f"the program takes {len(lowered.user_inputs)} inputs, the graph "
                               f"{len(example_inputs)}")
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        leaves, spec = pytree.tree_flatten(out_node.args[0])
        slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.fx.Node)]
        if len(slots) != len(lowered.outputs):
            raise ProgramError(f"the graph returns {len(slots)} tensors, the program "
                               f"{len(lowered.outputs)}")
        planned = plan(lowered.program, self.target, self.strategy)
        program = planned.program
        threads = self.threads or torch.get_num_threads()
        executor = TorchExecutor(planned.schedule(), threads)
        constants = {name: to_torch_storage(value, program.tensor(name).dtype)
                     for name, value in lowered.constants.items()}
        names = lowered.user_inputs
        outputs = tuple(zip(lowered.outputs, lowered.output_shapes, strict=True))
        failed: list[str] = []

        def run(*args: Any) -> Any:
            if failed:
                return gm.forward(*args)
            try:
                inputs = dict(constants)
                inputs.update(zip(names, args, strict=True))
                ys = executor.run(inputs)
                values = list(leaves)
                for slot, (name, shape) in zip(slots, outputs, strict=True):
                    values[slot] = ys[name].reshape(shape)
                return pytree.tree_unflatten(values, spec)
            except Exception as e:  # a failed run: eager from now on, said once
                failed.append(_reason(e))
                log.warning("apportion: the planned run of %r failed, running the graph "
                            "eagerly from now on: %s", program.name, failed[0])
                return gm.forward(*args)

        return run, planned


class _Specializing:
    """The run of a graph torch made symbolic (its sizes are ``SymInt`` inputs: dynamo's
    automatic dynamic shapes, e.g. the growing length of a KV cache in ``generate``): each call
    binds the sizes it is given, and each new binding (the ints, and every tensor's shape and
    dtype) is planned as a graph of static shapes (``CompileBackend._take``), at most ``limit`` of
    them; calls beyond run eagerly, said once."""

    #: the most bindings planned for one graph (each is a plan held in memory)
    limit = 64

    def __init__(self, owner: CompileBackend, gm: Any) -> None:
        self.owner = owner
        self.gm = gm
        self.runs: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self.full = False

    def __call__(self, *args: Any) -> Any:
        import torch

        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else ("int", a)
                    for a in args)
        run = self.runs.get(key)
        if run is None:
            if len(self.runs) >= self.limit:
                if not self.full:
                    self.full = True
                    log.warning("apportion: a symbolic graph met more than %d sizes; new "
                                "sizes run eagerly", self.limit)
                return self.gm.forward(*args)
            run = self._bind(args)
            self.runs[key] = run
        return run(*(a for a in args if isinstance(a, torch.Tensor)))

    def _bind(self, args: Sequence[Any]) -> Callable[..., Any]:
        """The run of the graph with its int inputs fixed to ``args``' ints, taking the
        tensors."""
        import torch

        gm = self.gm
        fixed = {i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}
        for i, a in fixed.items():
            if not isinstance(a, int):
                raise ExecutionError(f"graph input {i} is {type(a).__name__} {a!r}, neither "
                                     "a tensor nor a size")

        # the graph of these sizes: its int inputs become constants where they are read
        graph = copy.deepcopy(gm.graph)
        holders = [n for n in graph.nodes if n.op == "placeholder"]
        for i, value in fixed.items():
            node = holders[i]
            for user in list(node.users):
                user.args = torch.fx.node.map_arg(user.args,
                                                  lambda n, v=value, h=node: v if n is h else n)
                user.kwargs = torch.fx.node.map_arg(user.kwargs,
                                                    lambda n, v=value, h=node: v if n is h else n)
            graph.erase_node(node)
        bound = torch.fx.GraphModule(gm, graph)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        return self.owner._take(bound, tensors, tuple(fixed.values()))


def _check_inputs(example_inputs: list[Any]) -> None:
    """Refuse symbolic sizes and inputs that need their gradients (the plan carries no
    autograd history)."""
    import torch

    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise ProgramError(f"graph input {i} is {type(x).__name__} {x!r}, not a "
                               "tensor (a size torch made symbolic); apportion runs "
                               "static shapes here")
    if torch.is_grad_enabled() and any(x.requires_grad for x in example_inputs):
        raise ExecutionError("an input needs its gradient and autograd is on; apportion "
                             "runs inference only (call the model under torch.no_grad())")


def _partition(graph: Any, eager: set[str]) -> dict[str, int]:
    """Each call node's subgraph: a node's level is its operands' highest, plus one where an
    operand's flag (supported, or in ``eager``) differs from its own; a subgraph is one (level,
    flag). Every edge between subgraphs climbs a level, so they run in level order, and a
    supported node joins the earliest supported subgraph its operands allow (``sin`` below
    runs with ``relu``). A ``getitem`` (one result of a node) goes with its node.

    >>> import torch                                                         # doctest: +SKIP
    >>> f = lambda x: torch.i0(x.relu()).exp() + x.sin()                    # doctest: +SKIP
    >>> g = torch.fx.symbolic_trace(f).graph                                 # doctest: +SKIP
    >>> _partition(g, {"i0"})                                                # doctest: +SKIP
    {'relu': 0, 'i0': 3, 'exp': 4, 'sin': 0, 'add': 4}
    """
    level: dict[str, int] = {}
    flag: dict[str, bool] = {}
    out: dict[str, int] = {}
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        parents = [n for n in node.all_input_nodes if n.name in level]
        if node.target is operator.getitem and parents:
            lv, mine = level[parents[0].name], flag[parents[0].name]
        else:
            mine = node.name in eager
            lv = max((level[p.name] + (flag[p.name] != mine) for p in parents), default=0)
        level[node.name], flag[node.name] = lv, mine
        out[node.name] = 2 * lv + mine
    return out


def _flat_inputs(ep: Any) -> Callable[[Sequence[Any]], list[Any]]:
    """The exported graph's flat inputs for the captured graph's inputs: its lifted weights,
    buffers and constants, and the user inputs, in its signature's order."""
    fixed: dict[int, Any] = {}
    specs = ep.graph_signature.input_specs
    for i, spec in enumerate(specs):
        kind = spec.kind.name
        if kind == "USER_INPUT":
            continue
        if kind in ("PARAMETER", "BUFFER") and spec.target in ep.state_dict:
            fixed[i] = ep.state_dict[spec.target]
        elif spec.target in ep.constants:
            fixed[i] = ep.constants[spec.target]
        else:
            raise ProgramError(f"the exported graph's input {spec.arg} ({kind}) has no value "
                               "to split the graph with")

    def flat(args: Sequence[Any]) -> list[Any]:
        it = iter(args)
        return [fixed[i] if i in fixed else next(it) for i in range(len(specs))]

    return flat


def _split_runner(ep: Any, split: Any, flat: Callable[[Sequence[Any]], list[Any]]
                  ) -> Callable[..., Any]:
    """Run the split graph on the captured graph's inputs: write the inputs it mutates back
    (a functionalized ``index_copy_``, say), return its user outputs in the graph's
    structure."""
    from torch.utils import _pytree as pytree

    out_specs = ep.graph_signature.output_specs
    user_index = [i for i, s in enumerate(ep.graph_signature.input_specs)
                  if s.kind.name == "USER_INPUT"]
    user_names = [ep.graph_signature.input_specs[i].arg.name for i in user_index]
    out_spec = ep.call_spec.out_spec

    def run(*args: Any) -> Any:
        ys = split(*flat(args))
        ys = ys if isinstance(ys, tuple | list) else (ys,)
        user = []
        for spec, y in zip(out_specs, ys, strict=True):
            kind = spec.kind.name
            if kind == "USER_INPUT_MUTATION":
                args[user_names.index(spec.target)].copy_(y)
            elif kind == "USER_OUTPUT":
                user.append(y)
            else:
                raise ExecutionError(f"the split graph's output {spec.arg} is a {kind}, "
                                     "which the backend does not write back")
        return pytree.tree_unflatten(user, out_spec) if out_spec is not None else tuple(user)

    return run


def _reason(e: BaseException) -> str:
    """One line: an apportion error's message, else the exception's type and first line."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return first if isinstance(e, ApportionError) else f"{type(e).__name__}: {first}"


def backend(target: str | Target = "spyre", cores: int | None = None,
            strategy: str | Strategy = "balanced", threads: int | None = None) -> CompileBackend:
    """A ``torch.compile`` backend planning every graph for ``target`` (a preset name, a
    ``.toml`` file or a ``Target``) on ``cores`` cores (a preset name: default 8; a ``Target``
    keeps its own count unless ``cores`` is given) under ``strategy`` (a name or an
    ``ap.strategies`` object; ``CompileBackend.strategy`` is the object), and running the plans on
    ``threads`` threads (default: ``torch.get_num_threads()`` when a graph compiles).

    >>> b = backend(target="spyre", cores=8)
    >>> b.target.cores, b.strategy
    (8, Balanced())
    >>> from apportion.passes.strategy import Greedy
    >>> backend(strategy=Greedy(rule="multiples"))
    ap.backend(target='spyre', cores=8, strategy='greedy-multiples', threads=None)
    """
    if isinstance(target, Target):
        tgt = target if cores is None else dataclasses.replace(target, cores=cores)
    else:
        tgt = resolve(target, DEFAULT_CORES if cores is None else cores)
    chosen = parse_strategy(strategy)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ExecutionError(f"threads must be an int >= 1 or None, got {threads!r}")
    return CompileBackend(tgt, chosen, threads)
