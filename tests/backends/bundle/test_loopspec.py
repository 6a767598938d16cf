"""LoopSpec programs: structure, tensors, addresses, source / JSON round trips, and writes
through a merge of dims run by a simulator of the specs (``tests.backends.bundle.spec_sim``)."""

from dataclasses import replace
from pathlib import Path

import pytest

import apportion as ap
from apportion.backends.bundle.addressing import padded_strides
from apportion.backends.bundle.loopspec import _Builder, from_schedule
from apportion.backends.bundle.spec_text import from_json, from_source, to_json, to_source
from apportion.errors import EmitError
from apportion.frontend.json_format import from_dict
from apportion.planned import PlannedProgram
from apportion.plans.plan import Plan
from apportion.plans.tiles import iterations, tile_box
from apportion.runtime import kernels
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.schedule.loopspec_values import LoopSpec, OpSpec, TensorArg, walk
from apportion.schedule.lower import lower
from tests.backends.bundle.spec_sim import simulate
from tests.backends.merged import (
    EXAMPLE,
    SIMULATED,
    looped_program,
    merged_program,
    plan_in_loops,
    split_k_program,
)
from tests.helpers import program

ROOT = Path(__file__).parents[3]
EXAMPLES = sorted(p for p in ROOT.joinpath("examples").glob("*.json")
                  if p.name != "lm_head_prime_vocab.json")
SPYRE = ap.targets.spyre(cores=32)
FUSED_OPS = [{"name": "add", "op": "add", "out": "y[m,n]", "ins": ["a[m,n]", "b[m,n]"]},
             {"name": "mul", "op": "mul", "out": "z[m,n]", "ins": ["y[m,n]", "c[m,n]"]}]
FUSED_TENSORS = {t: ([1024, 4096], "float16") for t in "abc"}


def fused(counts=(2, 4)) -> ap.Program:
    """The two-op example (same as examples/fused.json), with its loop counts as given."""
    return program(FUSED_TENSORS, FUSED_OPS, ["z"], name="fused", tiling=[
        {"ops": ["add", "mul"], "loops": [{"count": counts[0], "dims": ["m"]},
                                          {"count": counts[1], "dims": ["n"]}]}])


def specs_of(prog: ap.Program, cores: int = 32):
    return ap.plan(prog, target=ap.targets.spyre(cores=cores)).loopspec()


def ops_of(specs) -> list[OpSpec]:
    return [s for _, s in walk(specs) if isinstance(s, OpSpec)]


def test_example_file_is_the_two_op_program():
    assert ap.load(ROOT / "examples/fused.json") == fused()


def test_fused_nests_both_ops_in_two_loops():
    specs = specs_of(fused())
    assert len(specs) == 1
    outer = specs[0]
    assert isinstance(outer, LoopSpec) and outer.count == 2
    (inner,) = outer.body
    assert isinstance(inner, LoopSpec) and inner.count == 4
    assert [(o.name, o.op) for o in inner.body] == [("add", "add"), ("mul", "mul")]
    add = inner.body[0]
    assert dict(add.iteration_space) == {"m": (512, 32), "n": (1024, 1)}
    assert add.tiled_symbols == ("m", "n") and not add.is_reduction
    assert repr(specs[0]).startswith("LoopSpec(count=2, body=[LoopSpec(count=4, body=[OpSpec(add")


def test_fused_tensor_args():
    add, mul = ops_of(specs_of(fused()))
    a, b, y = add.args
    assert [(x.tensor, x.is_input, x.arg_index) for x in add.args] == [
        ("a", True, 0), ("b", True, 1), ("y", False, 2)]
    assert a.allocation == {"hbm": 0} and b.allocation == {"hbm": 8388608}
    assert a.tile_strides == (4194304, 2048) and not a.per_tile_fixed
    assert a.device_size == (64, 1024, 64)  # sticks of n, m, elements of a stick
    assert a.device_coordinates == ("n floordiv 64", "m", "n mod 64")
    # y lives in the scratchpad, one tile at a fixed offset
    assert y.allocation == {"lx": 0} and y.memory == "lx" and y.per_tile_fixed
    assert y.device_size == (16, 512, 64) and y.tile_strides == (0, 0)
    assert mul.args[0] == replace(y, is_input=True, arg_index=0)
    z = mul.args[2]
    assert z.tensor == "z" and z.memory == "hbm" and z.tile_strides == (4194304, 2048)


def test_untiled_program_gives_bare_op_specs_in_program_order():
    prog = ap.load(ROOT / "examples/mlp.json")
    specs = specs_of(prog)
    assert all(isinstance(s, OpSpec) for s in specs)
    assert [s.name for s in specs] == [o.name for o in prog.ops]
    assert all(s.tiled_symbols == () and all(a.tile_strides == () for a in s.args)
               for s in specs)
    assert specs[0].is_reduction and not specs[2].is_reduction


def test_ops_outside_a_group_stay_bare_around_the_nest():
    prog = program({"x": ([256, 1024], "float16")},
                   [{"name": "pre", "op": "exp", "out": "u[m,n]", "ins": ["x[m,n]"]},
                    {"name": "in1", "op": "relu", "out": "v[m,n]", "ins": ["u[m,n]"]},
                    {"name": "post", "op": "neg", "out": "w[m,n]", "ins": ["v[m,n]"]}],
                   ["w"], tiling=[{"ops": ["in1"], "loops": [{"count": 2, "dims": ["m"]}]}])
    specs = specs_of(prog)
    assert [type(s).__name__ for s in specs] == ["OpSpec", "LoopSpec", "OpSpec"]
    assert [s.name for s in ops_of(specs)] == ["pre", "in1", "post"]


def test_accumulating_reduction_gets_an_init_and_reads_its_float32_accumulator():
    prog = program({"x": ([256, 1024], "float16"), "w": ([1024, 512], "float16")},
                   [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]}],
                   ["h"], tiling=[{"ops": ["mm"], "loops": [{"count": 2, "dims": ["m"]},
                                                           {"count": 4, "dims": ["k"]}]}])
    planned = ap.plan(prog, target=SPYRE)
    (outer,) = planned.loopspec()
    init, inner, finish = outer.body
    acc_buf = planned.plan.buffer("h", "accumulator")
    assert init.name == "mm.init" and init.op == "fill" and init.tiled_symbols == ("m",)
    # a tile-sized float32 accumulator (128 rows x 512 columns) in the scratchpad, reset before
    # the inner K loop at a fixed offset
    assert (acc_buf.space, acc_buf.shape) == ("lx", (128, 512))
    assert [a.tensor for a in init.args] == ["h"] and init.args[0].tile_strides == (0,)
    assert init.args[0].memory == "lx" and init.args[0].per_tile_fixed
    assert init.args[0].dtype == "float32" and init.args[0].device_size == (16, 128, 32)
    (mm,) = inner.body
    assert mm.is_reduction and [(a.tensor, a.is_input) for a in mm.args] == [
        ("x", True), ("w", True), ("h", True), ("h", False)]
    x, w, acc, out = mm.args
    # x[m,k] moves along rows and columns, w[k,n] along rows only, h stays on chip
    assert x.tile_strides == (128 * 2048, 256 * 2)
    assert w.tile_strides == (0, 256 * 1024)
    assert acc == replace(out, is_input=True, arg_index=2) and out.tile_strides == (0, 0)
    assert acc.address == acc_buf.offset and acc.memory == "lx"
    # after the K loop, inside the M loop: the accumulator is cast into the float16 result's
    # rows of this outer iteration
    assert finish.name == "mm.finish" and finish.op == "finish_sum"
    assert finish.tiled_symbols == ("m",)
    src, dst = finish.args
    assert (src.dtype, src.address, src.is_input, src.memory) == ("float32", acc_buf.offset,
                                                                  True, "lx")
    full = planned.plan.buffer("h", "full")
    assert (dst.dtype, dst.address, dst.is_input) == ("float16", full.offset, False)
    assert dst.tile_strides == (128 * 512 * 2,)


def test_tile_copied_out_of_the_loop():
    prog = program(FUSED_TENSORS, FUSED_OPS, ["z", "y"], tiling=[
        {"ops": ["add", "mul"], "loops": [{"count": 4, "dims": ["m"]}]}])
    (loop,) = specs_of(prog)
    assert [o.name for o in loop.body] == ["add", "add.copy", "mul"]
    src, dst = loop.body[1].args
    assert src.memory == "lx" and src.per_tile_fixed
    assert dst.memory == "hbm" and dst.tile_strides == (256 * 8192,) and not dst.is_input


def full_sizes(prog: ap.Program, name: str) -> dict[str, int]:
    return dict(prog.op(name).dims)


@pytest.mark.parametrize("tiling, accesses", [
    # a dim tiled at two levels, a transposed read, an affine index and a broadcast
    ([{"count": 2, "dims": ["m"]}, {"count": 2, "dims": ["m"]}, {"count": 2, "dims": ["n"]}],
     ["x[m,n]", "t[n,m]", "v[m]"]),
    ([{"count": 4, "dims": ["n"]}], ["x[m,n]", "t[n,m]", "v[m]"]),
])
def test_tile_strides_reach_each_tile_origin(tiling, accesses):
    tensors = {"x": ([256, 512], "float16"), "t": ([512, 256], "float32"),
               "v": ([256], "float16")}
    prog = program(tensors, [{"name": "f", "op": "add", "out": "o[m,n]",
                              "ins": [accesses[0], accesses[1]]},
                             {"name": "g", "op": "mul", "out": "p[m,n]",
                              "ins": ["o[m,n]", "x[m,n]"]},
                             {"name": "h", "op": "exp", "out": "q[m]", "ins": ["v[m]"]}],
                   ["p", "q"], tiling=[{"ops": ["f", "g"], "loops": tiling}])
    planned = ap.plan(prog, target=SPYRE)
    check_origins(prog, planned.plan, planned.loopspec())
    f = ops_of(planned.loopspec())[0]
    assert f.args[1].tensor == "t" and any(f.args[1].tile_strides)


def test_affine_index_strides_reach_each_tile_origin():
    prog = program({"x": ([64, 4096], "float16")},
                   [{"name": "e", "op": "exp", "out": "y[t,h,d]", "ins": ["x[t,128*h+d]"],
                     "dims": {"h": 32, "d": 128}}],
                   ["y"], tiling=[{"ops": ["e"], "loops": [{"count": 2, "dims": ["t"]},
                                                           {"count": 4, "dims": ["h"]}]}])
    planned = ap.plan(prog, target=SPYRE)
    (e,) = ops_of(planned.loopspec())
    assert e.args[0].tile_strides == (32 * 8192, 8 * 128 * 2)
    check_origins(prog, planned.plan, planned.loopspec())


def check_origins(prog: ap.Program, plan: Plan, specs) -> None:
    """Every moving tensor's address at every iteration is its tile origin's byte offset."""
    checked = set()
    for spec in ops_of(specs):
        loop = None if "." in spec.name else plan.op(spec.name).loop
        if loop is None:  # steps and ops outside loops
            continue
        op = prog.op(spec.name)
        counts = tuple(int(c) for c in loop.count)
        # an accumulating op reads its accumulator after its inputs
        accesses = (*op.ins, op.out, op.out) if len(spec.args) == len(op.ins) + 2 else (
            *op.ins, op.out)
        for index in iterations(counts):
            box = tile_box(full_sizes(prog, op.name), loop, index, counts, op.name)
            for arg, acc in zip(spec.args, accesses, strict=True):
                if arg.per_tile_fixed:
                    continue
                t = prog.tensor(acc.tensor)
                strides = padded_strides(t.shape, t.dtype, SPYRE)
                # the index's constant is the kernel's business (device coordinates), not the tile's
                origin = sum(sum(c * box[d][0] for d, c in e.terms) * s
                             for e, s in zip(acc.index, strides, strict=True))
                moved = sum(s * i for s, i in zip(arg.tile_strides, index, strict=True))
                assert moved == origin, (spec.name, acc.tensor, index)
                checked.add(acc.tensor)
    assert checked


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_source_and_json_round_trips_on_every_example(path):
    specs = specs_of(ap.load(path).bind())  # run-time sizes at their planning sizes
    assert from_source(to_source(specs)) == specs
    assert from_json(to_json(specs)) == specs
    assert hash(from_source(to_source(specs))) == hash(specs)


def test_round_trip_keeps_symbolic_counts():
    specs = specs_of(fused(("T", 4)))
    assert specs[0].count == "T"
    assert from_source(to_source(specs)) == specs and from_json(to_json(specs)) == specs
    a = ops_of(specs)[0].args[0]
    assert a.tile_strides == ("8388608 floordiv T", 2048)


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')",
    "[LoopSpec(count=2, body=[open('x')])]",
    "[LoopSpec(count=2, bogus=1)]",
    "[LoopSpec(count=2, body=[]) + 1]",
    "[1, 2]",
    "[LoopSpec(count=0)]",
])
def test_from_source_reads_only_spec_constructors(text):
    with pytest.raises(EmitError):
        from_source(text)


def test_values_validate_and_freeze():
    arg = TensorArg(True, 0, "float16", [4], ["m"], {"hbm": 0})
    with pytest.raises(EmitError, match="allocation"):
        replace(arg, allocation={"dram": 0})
    with pytest.raises(EmitError, match="device coordinates"):
        replace(arg, device_coordinates=["m", "n"])
    with pytest.raises(EmitError, match="fixed in place cannot move"):
        replace(arg, allocation={"lx": 0}, per_tile_fixed=True, tile_strides=[128])
    # a scratchpad tile read in loops deeper than its buffer moves within it
    assert replace(arg, allocation={"lx": 0}, tile_strides=[128]).memory == "lx"
    with pytest.raises(EmitError, match="tiled dim"):
        OpSpec("exp", False, {"m": (4, 1)}, [arg], ["n"])
    with pytest.raises(TypeError):
        arg.allocation["hbm"] = 5  # type: ignore[index]
    assert {arg, replace(arg)} == {arg}


def test_plan_without_buffers_is_an_emit_error():
    planned = ap.plan(fused(), target=SPYRE)
    with pytest.raises(EmitError, match="no buffer"):
        from_schedule(replace(planned.lowered, buffers=()), planned.target)


def test_consumer_after_the_nest_reads_the_finished_result_not_the_accumulator():
    prog = program({"x": ([256, 1024], "float16"), "w": ([1024, 512], "float16")},
                   [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
                    {"name": "act", "op": "exp", "out": "y[m,n]", "ins": ["h[m,n]"]}],
                   ["y"], tiling=[{"ops": ["mm"], "loops": [{"count": 4, "dims": ["k"]}]}])
    planned = ap.plan(prog, target=SPYRE)
    full = next(b for b in planned.plan.buffers_of("h") if b.kind == "full")
    act = ops_of(planned.loopspec())[-1]
    assert act.name == "act" and (act.args[0].address, act.args[0].dtype) == (full.offset,
                                                                              "float16")


# --- writes through a merge of dims, run by the spec simulator ---------------------------------

def simulated(planned: PlannedProgram, specs=None, seed: int = 0) -> list:
    """The checks of every output of ``specs`` (the plan's LoopSpec program) run by the
    simulator against the program run unplanned on the same inputs."""
    p = planned.program
    inputs = random_inputs(p, seed)
    out = simulate(p, planned.plan, planned.target,
                   planned.loopspec() if specs is None else specs, inputs)
    got = {**inputs, **{n: kernels.to_storage(v, p.tensor(n).dtype) for n, v in out.items()}}
    return compare(run_unplanned(p, inputs), got, p)


def test_the_simulator_runs_loop_nests_tiles_and_accumulators():
    # the simulator itself, on programs without merges: tiles in the scratchpad, a tile copied
    # out, an accumulator reset, combined and finished
    small = {t: ([64, 256], "float16") for t in "abc"}
    progs = [program(small, FUSED_OPS, ["z", "y"], tiling=[
        {"ops": ["add", "mul"], "loops": [{"count": 2, "dims": ["m"]},
                                          {"count": 2, "dims": ["n"]}]}]),
             program(small, FUSED_OPS, ["z", "y"], tiling=[
                 {"ops": ["add", "mul"], "loops": [{"count": 4, "dims": ["m"]}]}]),
             program({"x": ([64, 256], "float16"), "w": ([256, 128], "float16")},
                     [{"name": "mm", "op": "matmul", "out": "h[m,n]",
                       "ins": ["x[m,k]", "w[k,n]"]}], ["h"],
                     tiling=[{"ops": ["mm"], "loops": [{"count": 2, "dims": ["m"]},
                                                       {"count": 4, "dims": ["k"]}]}])]
    for prog in progs:
        checks = simulated(ap.plan(prog, target=ap.targets.spyre(cores=8)))
        assert checks and all(c.ok for c in checks), checks


@pytest.mark.parametrize("cores", [1, 8, 32])
def test_merged_writes_simulated_from_their_loopspec_match_the_reference(cores):
    planned = ap.plan(merged_program(SIMULATED), target=ap.targets.spyre(cores=cores))
    checks = simulated(planned, seed=cores)
    assert checks and all(c.ok for c in checks), checks
    assert from_json(to_json(planned.loopspec())) == planned.loopspec()


@pytest.mark.parametrize("cores", [8, 32])
def test_split_k_partials_through_a_merge_simulate_to_the_reference(cores):
    planned = ap.plan(split_k_program(), target=ap.targets.spyre(cores=cores))
    assert [s.name for s in ops_of(planned.loopspec())] == ["mm.partial", "mm.combine"]
    checks = simulated(planned)
    assert checks and all(c.ok for c in checks), checks


def test_a_merged_write_is_addressed_through_the_merge_in_the_device_layout():
    planned = ap.plan(from_dict(EXAMPLE), target=ap.targets.spyre(cores=8))
    m, e = ops_of(planned.loopspec())
    y = m.args[1]
    assert (y.tensor, y.is_input) == ("y", False)
    # y[8, 256] float32: sticks of 32 of its last axis, rows, elements of a stick
    assert y.device_size == (8, 8, 32)
    assert y.device_coordinates == ("(h * 64 + d) floordiv 32", "t", "(h * 64 + d) mod 32")
    assert e.args[0].device_coordinates == ("j floordiv 32", "t", "j mod 32")
    assert e.args[0].allocation == y.allocation


def test_the_simulator_fails_a_wrong_merged_address():
    planned = ap.plan(from_dict(EXAMPLE), target=ap.targets.spyre(cores=8))
    specs = planned.loopspec()

    def with_output_coordinates(coords):
        m, e = specs
        y = replace(m.args[1], device_coordinates=coords)
        return (replace(m, args=(m.args[0], y)), e)

    # the digits swapped: every element written once, but to the wrong place
    swapped = with_output_coordinates(("(d * 4 + h) floordiv 32", "t", "(d * 4 + h) mod 32"))
    assert not all(c.ok for c in simulated(planned, swapped))
    with pytest.raises(AssertionError, match="outside"):  # a stride past the axis
        simulated(planned, with_output_coordinates(("(h * 65 + d) floordiv 32", "t",
                                                     "(h * 65 + d) mod 32")))
    with pytest.raises(AssertionError, match="written twice"):  # h dropped
        simulated(planned, with_output_coordinates(("d floordiv 32", "t", "d mod 32")))


@pytest.mark.parametrize("cores", [1, 8])
def test_merged_writes_in_loop_nests_reach_each_tile_origin(cores):
    # plans the planner refuses (an op writing through a merge stays outside loop nests)
    prog = looped_program(symbolic=False)
    planned = plan_in_loops(prog, ap.targets.spyre(cores=cores))
    assert len(planned.groups) == 4
    specs = planned.loopspec()
    check_origins(prog, planned.plan, specs)
    checks = simulated(planned, specs)
    assert checks and all(c.ok for c in checks), checks


def test_one_cores_part_of_a_merged_scratchpad_tile_is_refused():
    # on 32 cores r splits h; its scratchpad accumulator, read in the loop deeper than it,
    # moves within one core's part of it, which a merged axis does not define
    planned = plan_in_loops(looped_program(symbolic=False), ap.targets.spyre(cores=32))
    assert planned.op("r").split_map["h"] > 1
    assert planned.plan.buffer("s", "accumulator").space == "lx"
    with pytest.raises(EmitError, match=r"op 'r' writes tensor 's' through the merge 64\*h\+d "
                                        r"split over cores, and its scratchpad tile is read in "
                                        r"loops deeper than the tile"):
        planned.loopspec()
    eight = ap.plan(from_dict(EXAMPLE), target=ap.targets.spyre(cores=8))  # only t split
    builder = _Builder(lower(eight.program, eight.plan, eight.target), eight.target)
    assert builder.per_core("y", (8, 256)) == (1, 256)
