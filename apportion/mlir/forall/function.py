"""The whole function of one schedule in the parallel IR (``mlir.forall``): its arguments (the
inputs, the symbolic loop counts, the run-time sizes no input has), its ops outside loops and
its loop groups, and the outputs it returns. ``FunctionRenderer`` is composed of the parts it
calls: the builder (``mlir.builder``), the context every part reads (``forall.context``), a
thread's computation (``forall.compute``), the fallbacks, the split reductions, the op renderer
and the loop groups."""

from __future__ import annotations

from apportion.ir.program import Program
from apportion.mlir.builder import INDENT, Block, Builder, symbol_name
from apportion.mlir.forall.compute import Compute
from apportion.mlir.forall.context import Context, symbols
from apportion.mlir.forall.fallback import Fallbacks
from apportion.mlir.forall.loops import LoopGroups
from apportion.mlir.forall.ops import OpRenderer
from apportion.mlir.forall.sizes import Sizes
from apportion.mlir.forall.split import SplitReductions
from apportion.mlir.forall.tensors import Env, TensorVal
from apportion.mlir.types import mlir_type
from apportion.schedule.values import Host, Launch, Loop, Schedule


class FunctionRenderer:
    """The function of ``schedule``; ``symbolic``, the program as given with run-time sizes,
    makes it one function for every size (``forall.sizes``)."""

    def __init__(self, schedule: Schedule, symbolic: Program | None = None) -> None:
        self.builder = Builder()
        names = self.builder.names
        program = schedule.program
        self.inputs = {name: names.fresh(name) for name in program.inputs}
        counts = {c: names.fresh(c) for c in symbols(schedule)}
        self.symbolic = symbolic
        sizes = Sizes(program) if symbolic is None else Sizes.symbolic(program, symbolic, names)
        self.ctx = Context.of(schedule, sizes, counts)
        self.compute = Compute(self.ctx)
        self.ops = OpRenderer(self.ctx, self.compute, Fallbacks(self.ctx, self.compute),
                              SplitReductions(self.ctx, self.compute))
        self.loops = LoopGroups(self.ctx, self.compute, self.ops)

    def text(self) -> str:
        ctx = self.ctx
        p, sizes = ctx.program, ctx.sizes
        top = Block(self.builder, 1)
        env: Env = {}
        args = []
        for name in p.inputs:
            ssa = self.inputs[name]
            env[name] = TensorVal(ssa, sizes.shape(name), mlir_type(p.tensor(name).dtype))
            args.append(f"{ssa}: {env[name].type}")
        args += [f"{ssa}: index" for ssa in ctx.counts.values()]
        if self.symbolic is not None:
            sizes.read(top, env)
            sizes.cut(top, {s.op: s.split_k for s, _ in ctx.schedule.walk()
                            if isinstance(s, Launch) and s.split_k is not None})
            args += [f"{sizes.symbols[s]}: index" for s in sizes.arguments]
        for step in ctx.schedule.steps:
            if isinstance(step, Launch | Host):
                self.ops.whole_op(top, p.op(step.op), env)
            elif isinstance(step, Loop):
                self.loops.group(top, step, env)
            # an Init or Finish outside loops is its loop group's: its accumulator starts
            # filled with the identity (group) and is finished after the loop (nest_loop)
        outs = [env[n] for n in p.outputs]
        types = ", ".join(v.type for v in outs)
        result = types if len(outs) == 1 else f"({types})"
        lines = [f"func.func @{symbol_name(p.name)}({', '.join(args)}) -> {result} {{",
                 *self.builder.const_lines, *top.lines,
                 f"{INDENT}return {', '.join(v.ssa for v in outs)} : {types}", "}"]
        return "\n".join(lines) + "\n"
