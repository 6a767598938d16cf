"""Thread-first parallel IR on tensors: a plan's schedule as MLIR ``scf.forall`` loops.

``forall_mlir`` reads one ``schedule.values.Schedule`` (the plan lowered by ``schedule.lower``;
nothing of the plan itself) and prints one ``func.func`` named after its program: it takes the
program inputs as tensors (then one ``index`` argument per symbolic loop count, named after it)
and returns the outputs. Every launch is one ``scf.forall`` over its worker grid
(``Launch.axes``), one induction variable per dim a worker axis splits (a launch of one worker
has no forall). A thread's box of the iteration space is its slice in whole planning units
(``Launch.units``; ``plans.views.dim_slices`` arithmetic: larger slices first): its start
an ``affine.apply`` of the thread id, its size static where the slices are equal and an
``affine.min`` where they are not. Each operand is read as the ``tensor.extract_slice`` of its
bounding box over the thread's box (``plans.tiles.region``; literal indices drop their axis) and
the op runs on the slices as a ``linalg.generic`` whose indexing maps are the accesses relative
to the slice (``x[t, 128*h+d]`` reads a wider slice through ``d1, d0 * 128 + d3``; a dim that no
access names alone gets a shape-only ``tensor.empty`` operand so that the generic knows its
range). A read through a sum that IREE 3.13 crashes on (three dims or more, ``64*a+32*c+d``:
``forall.tensors.iree_safe_map``) is a gather instead, a ``tensor.extract`` at the sum into a
tensor of one axis per dim that the generic reads through a projection. The body is the
backend's (``mlir.bodies``): value inputs convert to the compute type (``f32`` for
float16, bfloat16 and bool operands, as the reference executor computes; ``f32`` for float32
too, where the reference uses float64, but ``f64`` for a float32 sum, mean or product, whose
float32 error a later op can multiply by a row's length; ``i64`` for integers; ``f64`` where
integers meet floats or a kind has no integer body; IREE keeps ``f64``, its default demotion to
``f32`` off: ``runtime.FLAGS``), the result converts once to the output type. Each thread
writes its piece with ``tensor.parallel_insert_slice``.

Reductions and matmul accumulate into a ``linalg.fill`` of the reducer's identity (``f32`` for
float16/bfloat16, ``i64`` for integers, ``i1`` for ``any``); a reduction dim split over cores
makes the forall write one partial per slice into a ``[slices, ...output dims]`` tensor that a
``linalg.reduce`` then combines with the reducer's combine (``argmax`` carries value-index
pairs: the greater value wins, equal values the lower flat index, so any order gives numpy's
first maximum); ``mean`` divides by its count after. Fallbacks (sort, cumsum, flip) run whole
along the last axis of their input, with upstream linalg only: cumsum a running combine over
``j <= i`` (float32 summed in ``f64``, as the reference sums it: a long row's error grows), flip a
gather (``tensor.extract`` at ``n-1-i``: IREE tiles a reversed indexing map wrongly), sort by
rank (``O(n^2)`` per row: each element's rank counts the smaller ones, ties by position, NaN
last, then each rank picks its element).

A coarse-tiling loop group is ``scf.for`` loops as the schedule's ``Loop`` steps nest them (as
the reference executor runs them): an op runs in the loop that encloses it, over its tile at
those loops' ids (each level cuts the dims its launch steps along, ``Launch.steps``, into its
count of parts; a symbolic count, ``Loop.symbol``, is its function argument), so an op at a
lesser depth (``"depths"``) runs next to the inner loop of its
neighbours, a shallower op between deeper ones makes sibling inner loops, and an op over two dims
of one level runs its own inner loop. A tensor read outside the loop that writes it (after the
group, or by a shallower op) is carried whole in ``iter_args`` by every loop around its writer,
from a fill (IREE 3.13 fails at run time on loop-carried values that start from
``tensor.empty``: ``runtime.FLAGS``); a tensor read only inside that loop is one iteration's
tile, a fresh tensor every iteration. A reduction tiled by a loop accumulates into a whole
accumulator carried by every loop around it (``Launch.mode`` ``accumulate``): reset to its
identity before the loop that tiles the reduction (where its ``Init`` stands; its tile of the
loops outside), each tile's partial computed from its identity and
combined into it elementwise, as the reference executor does, and finished (cast, a mean
divided) after that loop (its ``Finish``), where shallower ops read it. A fallback in a loop
(``Host``) runs on its tile's region of its input, whole along the axis it works on. Static
tile geometry is affine maps of the loop and thread ids; a symbolic count divides with
``arith.divui``, slices of a run-time tile size use ``arith`` on ``index``, and a forall's
shared tensor keeps a static shape (the whole dim bounds a run-time tile: IREE cannot size a
dynamic tensor carried through a loop).

A forall carries a ``mapping`` where the schedule's target gives one
(``forall.context.forall_mapping``): worker grids on GPU blocks (``Schedule.forall_mapping``
``gpu_blocks``, the ``gpu`` preset's) as ``#gpu.block<x>`` (``y``, ``z``, or ``linear_dim_i``
beyond three ids); workers that are cores give none.

The renderer is composed of parts, each an object the next calls, none a base class of
another: ``FunctionRenderer`` (``forall.function``: the arguments and the walk over the
schedule) holds the builder (``mlir.builder``: SSA names, blocks, index arithmetic), the
``Context`` every part reads (``forall.context``: each op's ``Work``, the ``Sizes``), a
``Compute`` (``forall.compute``: a thread's computation), ``Fallbacks``, ``SplitReductions``,
the ``OpRenderer`` (``forall.ops``: one op over a tile) and the ``LoopGroups``
(``forall.loops``); the tensor work (``forall.tensors``) and the merged writes
(``forall.merge``) are functions of the block they write into.

A schedule of a program with run-time sizes (``Schedule.given``, the program as given) is one
function for every size (``forall.sizes``): ``?`` for symbolic dims, their sizes read with
``tensor.dim``, each split-K op's slices an ``arith.select`` chain on its run-time reduction
size (the partial launch's ``Launch.split_k``), every op's
slices cut from the run-time sizes as ``dim_slices`` cuts them (a thread past the last unit
gets an empty slice), and a forall whose shared output has a run-time size one linear thread id
(IREE cannot size a dynamic tensor that nested loops carry).

An op writing its output through a merge of dims (``y[t, 64*h+d]``) writes the split view of
its destination: a ``tensor.expand_shape`` into ``Op.split_shape`` (the row-major reshape), the op
then as one writing ``y[t, h, d]``, and a ``tensor.collapse_shape`` back
(``mlir.forall.merge``); its split reductions, accumulators and loop tiles are those of the
split view.

A kind the backend's table (``mlir.bodies``) lacks raises ``EmitError`` naming the op,
the kind and the backend; whole-tensor kinds (gathers, reshapes, constants, ...) read their
inputs by computed index (``mlir.forall.fallback``).

>>> import apportion as ap
>>> from apportion.schedule.lower import lower
>>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
>>> text = forall_mlir(lower(planned.program, planned.plan, planned.target))
>>> text.splitlines()[0]
'func.func @mlp(%x: tensor<256x1024xf16>, %wg: tensor<1024x2816xf16>, \
%wu: tensor<1024x2816xf16>, %wd: tensor<2816x1024xf16>) -> tensor<256x1024xf16> {'
>>> verify_mlir(text)
"""

from __future__ import annotations

from apportion.errors import EmitError
from apportion.ir.program import Program
from apportion.mlir.builder import Block, Builder, check_index
from apportion.mlir.builder import verify_mlir as verify_mlir
from apportion.mlir.forall.function import FunctionRenderer
from apportion.mlir.forall.tensors import slice_of
from apportion.mlir.index import Ix
from apportion.schedule.values import Schedule


def forall_mlir(schedule: Schedule) -> str:
    """The schedule (``schedule.lower``: the plan lowered, its symbolic loop counts at the
    values they were planned at, ``planned_counts``) as thread-first parallel IR on tensors
    (MLIR text, not verified; ``verify_mlir`` checks it). Every decision comes from the
    schedule: each op's worker grid and planning units (``Launch.axes``, ``Launch.units``),
    its loops (``Loop`` steps; a symbolic count stays the function argument named after it)
    and the dims each level tiles (the launch's nonzero steps), where accumulators reset and
    finish (``Init``/``Finish`` steps) and the fallbacks (``Host``). A schedule of a program
    with run-time sizes (``Schedule.given``) is one function for every size
    (``mlir.forall.sizes``).
    """
    program, symbolic = schedule.program, schedule.given
    if symbolic is not None:
        if not symbolic.symbols:
            symbolic = None
        elif symbolic.name != program.name or symbolic.inputs != program.inputs or \
                symbolic.outputs != program.outputs:
            raise EmitError(f"program {program.name!r} is not program {symbolic.name!r} "
                            "planned: their names, inputs or outputs differ")
    for t in program.tensors:
        for i, n in enumerate(t.shape):
            check_index(n, f"tensor {t.name!r} dim {i} (size)")
    for op in program.ops:
        for d, n in op.sizes.items():
            check_index(n, f"op {op.name!r} dim {d!r} (size)")
    return FunctionRenderer(schedule, symbolic).text()


def size_symbols(program: Program) -> tuple[str, ...]:
    """The run-time sizes the emitted function of ``program`` (a program as given, with
    symbols) takes as trailing ``index`` arguments, after the symbolic loop counts: those no
    input has (the others it reads with ``tensor.dim``)."""
    on_inputs = {s for n in program.inputs for _, s in program.tensor(n).dynamic}
    return tuple(s.name for s in program.symbols if s.name not in on_inputs)


def thread_slices(n: int, per: int, split: int, dynamic: bool = False) -> list[tuple[int, int]]:
    """(start, size) of every thread's slice as the emitted index arithmetic computes them,
    with the size ``n`` a constant or (``dynamic``) a run-time value; equals
    ``plans.views.dim_slices`` as (start, stop - start).

    >>> thread_slices(10, 1, 4), thread_slices(10, 1, 4, dynamic=True)
    ([(0, 3), (3, 3), (6, 2), (8, 2)], [(0, 3), (3, 3), (6, 2), (8, 2)])
    """
    builder = Builder()
    blk = Block(builder, 1)
    size = Ix.atom("%n") if dynamic else Ix(n)
    start, length = slice_of(blk, size, per, split, Ix.atom("%s"))
    return [(builder.evaluate(start, {"%n": n, "%s": s}),
             builder.evaluate(length, {"%n": n, "%s": s})) for s in range(split)]
