"""Automatic strategy search: every op's strategy chosen together, as an integer program.

The program becomes a graph of *nodes*, each with a list of strategies: every op (its
``op_strategies``), every program input (its candidate placements, or the one its annotation
gives), every annotated intermediate (the annotation alone) and every program output (any
sharding without pending reductions, ``outputs="replicated"`` only the replicated one, or its
annotation). An *edge* joins the node that makes a tensor to each node that reads it.

The integer program (solved by HiGHS through ``highspy``):

* a binary ``x[n, s]`` per node and strategy, one strategy per node;
* per edge and pair of strategies a continuous ``y[e, s, t] >= 0`` with ``sum_t y[e, s, t] =
  x[src, s]`` and ``sum_s y[e, s, t] = x[dst, t]``: the joint choice, exact once the ``x`` are
  integral;
* the objective: each op's compute time under its strategy on the largest device
  (``plan.CostModel``: apportion's cost model over the device's cores) plus, per edge, the time
  of resharding the tensor from what its maker gives to what its reader needs
  (``collectives.steps``, priced by the mesh's links, and writing the copy), one resharding
  per reader, or, along a peered axis, of the reader reading the tensor in place from its
  peers' memory where that is cheaper (``plan.read_us``: no copy, but the link paid on every
  read of an element);
* with a per-device memory capacity (``Mesh.memory_bytes``), at every program point the bytes
  a device holds, its shard of every input, of every tensor live there and of every resharded
  copy read there, stay within the capacity.

Annotations are constraints: an annotated tensor's node has the annotation as its only strategy.

Tiling groups are constraints too: an op of a group is offered only the strategies whose every
device share of a dim the group's loops tile is cut by the counts tiling it into whole tiles
(of whole sticks where the op writes along the dim; ``plan.fits_tiling``), so the per-device
programs keep the group with its counts (``unroll``'s rule); the replicated strategy always
fits. And the ops of a group split every dim they share
alike (one row per group, dim, pair of ops and way of splitting it), since a device's loops
step one size per dim: the search never makes a plan whose per-device programs would see one
dim of a group at two sizes.

Repeated identical layers share one solution. Nodes are classed by a few rounds of
Weisfeiler-Lehman refinement over the graph, starting from each node's name-free signature (an
op's kind, dims, index expressions, operand shapes and dtypes; a tensor node's shape, dtype and
annotation): nodes whose neighbourhoods three edges deep look alike fall in one class, and a
class takes one strategy, its costs and edges counted once per member. A 32-layer forward pass
then has the variables of a few layers.

In float32 the MLP below is Megatron's: column-split, then row-split and one all-reduce. In
float16 its partial sums would move in float32 (``spec.partial_dtype``: they round once,
reduced), and gathering the float16 activations costs less than that all-reduce.

>>> from dataclasses import replace
>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.spec import Sharding
>>> p = load("examples/mlp.json")
>>> p32 = replace(p, tensors=tuple(replace(t, dtype="float32") for t in p.tensors))
>>> rep = Sharding(((), ()))
>>> plan = search(p32, parse("tp=4"), annotations={"x": rep, "y": rep})
>>> [plan.strategy(o).label for o in ("gate", "up", "act", "glu", "down")]
['n:tp', 'n:tp', 'n:tp', 'n:tp', 'k:tp']
>>> plan.collectives_text(), search(p, parse("tp=4"), annotations={"x": rep, "y": rep}
...                                 ).collectives_text()
('1 all_reduce', '2 all_gather')
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from apportion.errors import PlanningError
from apportion.ir.program import Program
from apportion.sharding.collectives import reshard_time
from apportion.sharding.mesh import Mesh, mesh_of
from apportion.sharding.plan import (
    CostModel,
    ShardingPlan,
    build_plan,
    default_target,
    read_us,
    tiled_granules,
    tiling_strategies,
)
from apportion.sharding.rules import OpSharding
from apportion.sharding.spec import (
    Sharding,
    annotations_given,
    annotations_of,
    candidates,
    check_annotations,
    program_of,
)
from apportion.target.target import Target

OUTPUTS = ("any", "replicated")
#: Weisfeiler-Lehman rounds that class the nodes
ROUNDS = 3


@dataclass
class Node:
    """One node of the search graph: an op, an input, an annotation or an output."""

    kind: str  # "op", "in", "ann", "out"
    name: str  # op or tensor name
    tensor: str  # the tensor it makes (an op's output)
    outs: list[Sharding]  # per strategy: what it makes
    ins: list[tuple[Sharding, ...]]  # per strategy: what it needs, per input position
    label: Any = None
    compute: list[float] = field(default_factory=list)
    strategies: tuple = ()


@dataclass(frozen=True)
class Edge:
    src: int
    dst: int
    pos: int
    tensor: str
    point: int  # the program point where the reader reads


def _graph(program: Program, mesh: Mesh, ann: Mapping[str, Sharding], outputs: str,
           target: Target) -> tuple[list[Node], list[Edge]]:
    nodes: list[Node] = []
    edges: list[Edge] = []
    maker: dict[str, int] = {}
    placements: dict[tuple[int, ...], list[Sharding]] = {}
    by_sig: dict[Any, tuple[OpSharding, ...]] = {}
    tiled = tiled_granules(program, target)
    for name in program.inputs:
        t = program.tensor(name)
        opts = [ann[name]] if name in ann else \
            placements.setdefault(t.shape, list(candidates(t.shape, mesh)))
        nodes.append(Node("in", name, name, opts, [()] * len(opts),
                          ("in", t.shape, t.dtype, str(ann.get(name)))))
        maker[name] = len(nodes) - 1
    for i, op in enumerate(program.ops):
        slot = {t: k for k, t in enumerate(dict.fromkeys(a.tensor for a in op.operands))}
        sig = (op.fn, op.attrs, op.dims, tuple(
            (slot[a.tensor], tuple(e.to_source() for e in a.index),
             program.tensor(a.tensor).shape, program.tensor(a.tensor).dtype)
            for a in op.operands), op.out.tensor in program.outputs,
            tuple(sorted(tiled.get(op.name, {}).items())))
        # equal signatures give equal strategies (the op's name aside): enumerate them once
        if sig not in by_sig:
            by_sig[sig] = tiling_strategies(op, program, mesh, tiled.get(op.name, {}))
        opts = tuple(s if s.op == op.name else replace(s, op=op.name) for s in by_sig[sig])
        nodes.append(Node("op", op.name, op.out.tensor, [s.out for s in opts],
                          [s.ins for s in opts], ("op", sig), strategies=opts))
        me = len(nodes) - 1
        for k, acc in enumerate(op.ins):
            edges.append(Edge(maker[acc.tensor], me, k, acc.tensor, i))
        maker[op.out.tensor] = me
        t = program.tensor(op.out.tensor)
        if op.out.tensor in ann:
            s = ann[op.out.tensor]
            nodes.append(Node("ann", op.out.tensor, op.out.tensor, [s], [(s,)],
                              ("ann", t.shape, t.dtype, str(s))))
            edges.append(Edge(me, len(nodes) - 1, 0, op.out.tensor, i))
            maker[op.out.tensor] = len(nodes) - 1
    end = len(program.ops)
    for name in program.outputs:
        t = program.tensor(name)
        if name in ann:
            opts = [ann[name]]
        elif outputs == "replicated":
            opts = [Sharding.replicated(t.rank)]
        else:
            opts = placements.setdefault(t.shape, list(candidates(t.shape, mesh)))
        nodes.append(Node("out", name, name, opts, [(s,) for s in opts],
                          ("out", t.shape, t.dtype, str(ann.get(name)), outputs)))
        edges.append(Edge(maker[name], len(nodes) - 1, 0, name, end))
    return nodes, edges


def _classes(nodes: list[Node], edges: list[Edge], rounds: int) -> list[int]:
    """Class id per node: equal after ``rounds`` of Weisfeiler-Lehman refinement."""
    preds: list[list[tuple[int, int]]] = [[] for _ in nodes]
    succs: list[list[tuple[int, int]]] = [[] for _ in nodes]
    for e in edges:
        preds[e.dst].append((e.pos, e.src))
        succs[e.src].append((e.pos, e.dst))
    ids: dict[Any, int] = {}
    label = [ids.setdefault(n.label, len(ids)) for n in nodes]
    for _ in range(rounds):
        ids = {}
        label = [ids.setdefault((label[i], tuple(sorted((p, label[s]) for p, s in preds[i])),
                                 tuple(sorted((p, label[d]) for p, d in succs[i]))), len(ids))
                 for i in range(len(nodes))]
    return label


def _live(program: Program) -> tuple[dict[str, int], dict[str, int]]:
    """Per tensor made by an op: the point it is made, and its last point live."""
    n = len(program.ops)
    born: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, op in enumerate(program.ops):
        born[op.out.tensor] = i
        last.setdefault(op.out.tensor, i)
        for acc in op.ins:
            last[acc.tensor] = i
    for name in program.outputs:
        last[name] = n
    return born, last


class _Model:
    """Columns and rows of the integer program, row-wise."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.upper: list[float] = []
        self.integer: list[bool] = []
        self.rows: list[tuple[dict[int, float], float, float]] = []

    def col(self, cost: float, integer: bool, upper: float = 1.0) -> int:
        self.cost.append(cost)
        self.upper.append(upper)
        self.integer.append(integer)
        return len(self.cost) - 1

    def row(self, coeffs: dict[int, float], lo: float, hi: float) -> None:
        self.rows.append((coeffs, lo, hi))

    def solve(self, time_limit: float) -> tuple[np.ndarray, float, str]:
        import highspy

        lp = highspy.HighsLp()
        lp.num_col_ = len(self.cost)
        lp.num_row_ = len(self.rows)
        lp.col_cost_ = np.array(self.cost, dtype=float)
        lp.col_lower_ = np.zeros(len(self.cost))
        lp.col_upper_ = np.array(self.upper, dtype=float)
        lp.row_lower_ = np.array([lo for _, lo, _ in self.rows], dtype=float)
        lp.row_upper_ = np.array([hi for _, _, hi in self.rows], dtype=float)
        starts, index, value = [0], [], []
        for coeffs, _, _ in self.rows:
            for c, v in sorted(coeffs.items()):
                index.append(c)
                value.append(v)
            starts.append(len(index))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(value, dtype=float)
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else
                           highspy.HighsVarType.kContinuous for i in self.integer]
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(time_limit))
        h.setOptionValue("mip_rel_gap", 1e-6)
        h.passModel(lp)
        h.run()
        status = h.getModelStatus()
        text = h.modelStatusToString(status)
        if status != highspy.HighsModelStatus.kOptimal:
            sol = h.getSolution()
            if status == highspy.HighsModelStatus.kTimeLimit and sol.value_valid:
                return np.array(sol.col_value), h.getInfo().objective_function_value, text
            return np.array([]), float("nan"), text
        return np.array(h.getSolution().col_value), h.getInfo().objective_function_value, text


def search(program: Any, mesh: Mesh, target: Target | None = None,
           annotations: Mapping[str, Sharding] | None = None, outputs: str = "any",
           time_limit: float = 60.0, rounds: int = ROUNDS) -> ShardingPlan:
    """The plan with the least predicted time within each device's memory (see the module
    docstring). ``outputs``: ``any`` (each output handed back in the sharding the search
    likes best) or ``replicated``; ``annotations`` join those ``ap.shard`` recorded."""
    start = time.perf_counter()
    if not isinstance(outputs, str) or outputs not in OUTPUTS:
        raise PlanningError(f"outputs must be one of {', '.join(OUTPUTS)}, got {outputs!r}")
    if isinstance(time_limit, bool) or not isinstance(time_limit, int | float) or \
            not time_limit > 0:
        raise PlanningError(f"search: time_limit must be a number of seconds > 0, got "
                            f"{time_limit!r}"[:200])
    annotations = annotations_given(annotations, "search")
    given = {**annotations_of(program), **(annotations or {})}
    prog = program_of(program, "search")
    mesh = mesh_of(mesh, "search")
    ann = check_annotations(prog, given, mesh)
    tgt = default_target(mesh, target)
    cost = CostModel(prog, mesh, tgt)
    sizes = {a.name: a.size for a in mesh.axes}
    _check_fits(prog, mesh, ann)
    nodes, edges = _graph(prog, mesh, ann, outputs, tgt)
    cls = _classes(nodes, edges, rounds)
    members: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(cls):
        members[c].append(i)
    for ms in members.values():  # one strategy list per class, its compute priced once
        rep = nodes[ms[0]]
        if any(len(nodes[m].outs) != len(rep.outs) for m in ms):
            raise PlanningError(f"search: nodes {[nodes[m].name for m in ms]} were classed "
                                "together but differ")
        if rep.kind == "op":
            op = prog.op(rep.name)
            rep.compute = [cost.compute_us(op, s) for s in rep.strategies]
        else:
            rep.compute = [0.0] * len(rep.outs)
    model = _Model()
    xcol: dict[int, list[int]] = {}
    lin: dict[int, np.ndarray] = {c: np.zeros(len(nodes[ms[0]].outs))
                                  for c, ms in members.items()}
    for c, ms in members.items():
        lin[c] += len(ms) * np.array(nodes[ms[0]].compute)
    # edges by class pair
    grouped: dict[tuple[int, int, int], list[Edge]] = defaultdict(list)
    for e in edges:
        grouped[(cls[e.src], cls[e.dst], e.pos)].append(e)
    matrices: dict[tuple[int, int, int], np.ndarray] = {}
    for key, es in grouped.items():
        cs, cd, pos = key
        src, dst = nodes[members[cs][0]], nodes[members[cd][0]]
        t = prog.tensor(es[0].tensor)
        if dst.kind == "op":  # a copy, or a read in place from the peers where cheaper
            op = prog.op(dst.name)
            mat = np.array([[read_us(prog, op, pos, st, o, mesh, tgt)[0]
                             for st in dst.strategies] for o in src.outs])
        else:
            mat = np.array([[reshard_time(t.shape, t.dtype, o, need[pos], mesh)
                             for need in dst.ins] for o in src.outs])
        matrices[key] = mat
        m = len(es)
        if cs == cd:
            lin[cs] += m * np.diag(mat)
        elif mat.shape[0] == 1:
            lin[cd] += m * mat[0]
        elif mat.shape[1] == 1:
            lin[cs] += m * mat[:, 0]
    for c in members:
        xcol[c] = [model.col(float(v), True) for v in lin[c]]
        model.row(dict.fromkeys(xcol[c], 1.0), 1.0, 1.0)
    _tiling_rows(model, prog, nodes, cls, xcol)
    ycol: dict[tuple[int, int, int], np.ndarray] = {}
    for key, es in grouped.items():
        cs, cd, _ = key
        mat = matrices[key]
        if cs == cd or mat.shape[0] == 1 or mat.shape[1] == 1:
            continue
        cols = np.array([[model.col(float(len(es) * mat[s, u]), False)
                          for u in range(mat.shape[1])] for s in range(mat.shape[0])])
        ycol[key] = cols
        for s in range(mat.shape[0]):
            model.row({**{int(v): 1.0 for v in cols[s]}, xcol[cs][s]: -1.0}, 0.0, 0.0)
        for u in range(mat.shape[1]):
            model.row({**{int(v): 1.0 for v in cols[:, u]}, xcol[cd][u]: -1.0}, 0.0, 0.0)
    if mesh.memory_bytes is not None:
        _memory_rows(model, prog, mesh, nodes, edges, cls, xcol, ycol, sizes, tgt)
    setup = time.perf_counter()
    sol, objective, status = model.solve(time_limit)
    ilp_s = time.perf_counter() - setup
    if not sol.size:
        if status == "Infeasible":
            raise PlanningError(f"no strategy of program {prog.name!r} fits mesh {mesh.name!r} "
                                f"({mesh.devices} devices, "
                                f"{(mesh.memory_bytes or 0) / 2**20:.1f} MiB each): the inputs "
                                "fit split every way, but no choice keeps every point of the "
                                "program within the memory")
        raise PlanningError(f"strategy search of program {prog.name!r} failed: {status}")
    pick = {c: int(np.argmax(sol[cols])) for c, cols in xcol.items()}
    strategies = {}
    inputs: dict[str, Sharding] = {}
    outs: dict[str, Sharding] = {}
    for i, n in enumerate(nodes):
        rep = nodes[members[cls[i]][0]]
        s = pick[cls[i]]
        if n.kind == "op":
            strategies[n.name] = n.strategies[s]
        elif n.kind == "in":
            inputs[n.name] = rep.outs[s]
        elif n.kind == "out":
            outs[n.name] = rep.outs[s]
    stats = {"nodes": len(nodes), "classes": len(members), "columns": len(model.cost),
             "rows": len(model.rows), "cost_evaluations": cost.evaluated,
             "ilp_s": round(ilp_s, 4), "status": status}
    plan = build_plan(prog, mesh, tgt, strategies, inputs, outs, ann, "search", 0.0, cost,
                      objective_us=float(objective), stats=stats)
    return replace(plan, solve_s=time.perf_counter() - start)


def _tiling_rows(model: _Model, prog: Program, nodes: Sequence[Node], cls: Sequence[int],
                 xcol: Mapping[int, list[int]]) -> None:
    """Ops of one tiling group split each dim they share alike (the group's loops step one
    size per dim on a device): per group, dim and pair of consecutive ops having it, and per
    way of splitting it, the two ops choose it together or not at all."""
    node_of = {n.name: i for i, n in enumerate(nodes) if n.kind == "op"}
    seen: set[tuple[int, int, str]] = set()
    for g in prog.tiling:
        last: dict[str, int] = {}  # dim -> the last node of the group having it
        for name in g.ops:
            i = node_of[name]
            for d in prog.op(name).sizes:
                j = last.get(d)
                last[d] = i
                if j is None or cls[i] == cls[j] or (cls[j], cls[i], d) in seen:
                    continue  # one class: one choice, the same splits
                seen.add((cls[j], cls[i], d))
                ways: dict[tuple[str, ...], dict[int, float]] = defaultdict(dict)
                for node, sign in ((j, 1.0), (i, -1.0)):
                    for k, st in enumerate(nodes[node].strategies):
                        ways[st.split_map.get(d, ())][xcol[cls[node]][k]] = sign
                for coeffs in ways.values():
                    model.row(coeffs, 0.0, 0.0)


def _memory_rows(model: _Model, prog: Program, mesh: Mesh, nodes: Sequence[Node],
                 edges: Sequence[Edge], cls: Sequence[int], xcol: Mapping[int, list[int]],
                 ycol: Mapping[tuple[int, int, int], np.ndarray], sizes: Mapping[str, int],
                 target: Target) -> None:
    """At every program point, a device's shards of the inputs, of the tensors live there and
    of the copies read there stay within ``mesh.memory_bytes`` (a read in place from the
    peers, ``plan.read_us``, holds no copy). None are added when the whole program fits
    replicated with a copy per reader (the rows could never bind)."""
    cap = float(mesh.memory_bytes or 0)
    whole = sum(t.nbytes for t in prog.tensors) + sum(prog.tensor(e.tensor).nbytes
                                                      for e in edges)
    if whole <= cap:
        return
    memo: dict[tuple[str, Sharding], float] = {}

    def nbytes(tensor: str, s: Sharding) -> float:
        key = (tensor, s)
        if key not in memo:
            t = prog.tensor(tensor)
            memo[key] = float(s.local_bytes(t.shape, t.dtype, sizes))
        return memo[key]

    inputs: dict[int, float] = defaultdict(float)
    for i, n in enumerate(nodes):
        if n.kind == "in":
            for s, sh in enumerate(n.outs):
                inputs[xcol[cls[i]][s]] += nbytes(n.tensor, sh)
    held = model.col(0.0, False, upper=float("inf"))
    model.row({**inputs, held: -1.0}, 0.0, 0.0)
    born, last = _live(prog)
    maker = {n.tensor: i for i, n in enumerate(nodes) if n.kind == "op"}
    annotated = {n.tensor: n.outs[0] for n in nodes if n.kind == "ann"}
    points: list[dict[int, float]] = [defaultdict(float) for _ in range(len(prog.ops) + 1)]
    fixed = [0.0] * (len(prog.ops) + 1)
    for tensor, b in born.items():
        i = maker[tensor]
        terms = [(xcol[cls[i]][s], nbytes(tensor, sh)) for s, sh in enumerate(nodes[i].outs)]
        # an annotated tensor: as made until its resharding right after, then as annotated
        end = min(b + 1, last[tensor]) if tensor in annotated else last[tensor]
        for p in range(b, end + 1):
            row = points[p]
            for c, v in terms:
                row[c] += v
        if tensor in annotated:
            for p in range(b + 1, last[tensor] + 1):
                fixed[p] += nbytes(tensor, annotated[tensor])
    for e in edges:
        if nodes[e.dst].kind == "ann":
            continue
        key = (cls[e.src], cls[e.dst], e.pos)
        src, dst = nodes[e.src], nodes[e.dst]
        row = points[e.point]
        for s, have in enumerate(src.outs):
            for u, need in enumerate(dst.ins):
                if have == need[e.pos]:
                    continue
                if dst.kind == "op" and read_us(prog, prog.op(dst.name), e.pos, dst.strategies[u],
                                                have, mesh, target)[1] is not None:
                    continue  # read in place: no copy held
                b = nbytes(e.tensor, need[e.pos])
                if key in ycol:
                    row[int(ycol[key][s, u])] += b
                elif key[0] == key[1]:
                    if s == u:
                        row[xcol[key[0]][s]] += b
                elif len(src.outs) == 1:
                    row[xcol[key[1]][u]] += b
                else:
                    row[xcol[key[0]][s]] += b
    seen = set()
    for row, const in zip(points, fixed, strict=True):
        coeffs = {c: v for c, v in row.items() if v}
        sig = (tuple(sorted(coeffs.items())), const)
        if sig in seen:
            continue
        seen.add(sig)
        model.row({**coeffs, held: 1.0}, 0.0, cap - const)


def _check_fits(prog: Program, mesh: Mesh, ann: Mapping[str, Sharding]) -> None:
    """Refuse up front a mesh whose devices cannot hold the inputs even split every way."""
    cap = mesh.memory_bytes
    if cap is None:
        return
    sizes = {a.name: a.size for a in mesh.axes}
    best: list[tuple[int, str, Sharding]] = []
    for name in prog.inputs:
        t = prog.tensor(name)
        opts = [ann[name]] if name in ann else list(candidates(t.shape, mesh))
        b, s = min(((s.local_bytes(t.shape, t.dtype, sizes), s) for s in opts),
                   key=lambda x: x[0])
        best.append((b, name, s))
    need = sum(b for b, _, _ in best)
    if need <= cap:
        return
    top = sorted(best, key=lambda x: -x[0])[:3]
    parts = ", ".join(f"tensor {n!r} {b / 2**20:.1f} MiB per device at best, as {s}"
                      for b, n, s in top)
    raise PlanningError(f"program {prog.name!r} does not fit mesh {mesh.name!r}: its inputs "
                        f"need at least {need / 2**20:.1f} MiB per device split every way they "
                        f"can be, each device has {cap / 2**20:.1f} MiB ({parts})")
