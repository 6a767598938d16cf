"""``ap.backend``: apportion as a ``torch.compile`` backend.

``torch.compile(model, backend=ap.backend(target="spyre", cores=8))`` hands every graph
TorchDynamo captures to the backend, which lowers it (``frontend.torch_export.from_torch``),
plans it (``ap.plan``) and returns a callable that runs the plan core slice by core slice with
torch kernels on a thread pool (``backends.torch.executor``). The graph's constants (lifted
parameters, buffers, scalars) become torch tensors once; each call binds the graph's inputs to
the program's, runs the plan and returns torch tensors in the graph's output structure.

A graph apportion cannot take, for any reason (an op with no lowering, a plan that does not
fit, symbolic sizes, inputs that need gradients), runs eagerly (``gm.forward``) with exactly one
record on the ``apportion`` logger saying why; so does a graph whose run fails, from then on.
No apportion error reaches the user's model. The backend keeps what became of each graph in
``graphs`` (``Graph``: the planned program, or the reason it ran eagerly).

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

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from apportion.errors import ApportionError, ExecutionError, ProgramError
from apportion.passes.strategy import Strategy, parse_strategy
from apportion.planned import PlannedProgram, plan
from apportion.target.presets import resolve
from apportion.target.target import Target

__all__ = ["Backend", "Graph", "backend"]

#: the logger a graph that runs eagerly is reported on
log = logging.getLogger("apportion")

#: the core count of a preset named without one
DEFAULT_CORES = 8


@dataclass(frozen=True)
class Graph:
    """What became of one captured graph: ``planned`` when apportion runs it, else the
    ``reason`` it runs eagerly."""

    planned: PlannedProgram | None
    reason: str | None = None


class Backend:
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
        try:
            run, planned = self._compile(gm, list(example_inputs))
        except Exception as e:  # anything at all: the model runs eagerly, never fails here
            reason = _reason(e)
            log.warning("apportion: running the graph eagerly: %s", reason)
            self.graphs.append(Graph(None, reason))
            return gm.forward
        self.graphs.append(Graph(planned))
        return run

    def _compile(self, gm: Any, example_inputs: list[Any]
                 ) -> tuple[Callable[..., Any], PlannedProgram]:
        import torch
        from torch.utils import _pytree as pytree

        from apportion.backends.torch.executor import TorchExecutor, to_torch_storage
        from apportion.frontend.torch_export import from_torch

        for i, x in enumerate(example_inputs):
            if not isinstance(x, torch.Tensor):
                raise ProgramError(f"graph input {i} is {type(x).__name__} {x!r}, not a "
                                   "tensor (a size torch made symbolic); apportion runs "
                                   "static shapes here")
        if torch.is_grad_enabled() and any(x.requires_grad for x in example_inputs):
            raise ExecutionError("an input needs its gradient and autograd is on; apportion "
                                 "runs inference only (call the model under torch.no_grad())")
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
        executor = TorchExecutor(program, planned.plan, threads)
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


def _reason(e: BaseException) -> str:
    """One line: an apportion error's message, else the exception's type and first line."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return first if isinstance(e, ApportionError) else f"{type(e).__name__}: {first}"


def backend(target: str | Target = "spyre", cores: int | None = None,
            strategy: str | Strategy = "balanced", threads: int | None = None) -> Backend:
    """A ``torch.compile`` backend planning every graph for ``target`` (a preset name, a
    ``.toml`` file or a ``Target``) on ``cores`` cores (a preset name: default 8; a ``Target``
    keeps its own count unless ``cores`` is given) under ``strategy`` (a name or an
    ``ap.strategies`` object; ``Backend.strategy`` is the object), and running the plans on
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
    return Backend(tgt, chosen, threads)
