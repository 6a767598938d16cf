"""The loop bundle: golden MLIR text, verification with the MLIR bindings, unrolled form, and
the addresses of writes through a merge of dims."""

import re
from dataclasses import replace
from pathlib import Path

import pytest

import apportion as ap
from apportion.cli.main import main
from apportion.errors import EmitError
from apportion.mlir.builder import verify_mlir
from apportion.mlir.bundle import address_map, render_bundle
from apportion.schedule.loopspec_values import LoopSpec, OpSpec, TensorArg
from tests.backends.bundle.test_loopspec import fused, ops_of, simulated
from tests.backends.merged import looped_program, merged_program, plan_in_loops
from tests.helpers import program

ROOT = Path(__file__).parents[3]
EXAMPLES = sorted(p for p in ROOT.joinpath("examples").glob("*.json")
                  if p.name != "lm_head_prime_vocab.json")
SPYRE = ap.targets.spyre(cores=32)

FUSED_GOLDEN = """\
#tile_a = affine_map<(d0, d1)[s0] -> (s0 + d0 * 4194304 + d1 * 2048)>
#tile_b = affine_map<(d0, d1)[s0] -> (s0 + d0 * 4194304 + d1 * 2048)>
#tile_c = affine_map<(d0, d1)[s0] -> (s0 + d0 * 4194304 + d1 * 2048)>
#tile_z = affine_map<(d0, d1)[s0] -> (s0 + d0 * 4194304 + d1 * 2048)>
func.func @fused() {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  %a_hbm = arith.constant 0 : index  // a hbm
  %b_hbm = arith.constant 8388608 : index  // b hbm
  %y_lx = arith.constant 0 : index  // y lx
  %c_hbm = arith.constant 16777216 : index  // c hbm
  %z_hbm = arith.constant 25165824 : index  // z hbm
  scf.for %i0 = %c0 to %c2 step %c1 {
    scf.for %i1 = %c0 to %c4 step %c1 {
      %a_tile = affine.apply #tile_a(%i0, %i1)[%a_hbm]
      %b_tile = affine.apply #tile_b(%i0, %i1)[%b_hbm]
      "apportion.execute"(%a_tile, %b_tile, %y_lx) {kernel = "add.kernel", op = "add", \
tensors = ["a", "b", "y"], memory = ["hbm", "hbm", "lx"], num_inputs = 2 : i64} : \
(index, index, index) -> ()
      %c_tile = affine.apply #tile_c(%i0, %i1)[%c_hbm]
      %z_tile = affine.apply #tile_z(%i0, %i1)[%z_hbm]
      "apportion.execute"(%y_lx, %c_tile, %z_tile) {kernel = "mul.kernel", op = "mul", \
tensors = ["y", "c", "z"], memory = ["lx", "hbm", "hbm"], num_inputs = 2 : i64} : \
(index, index, index) -> ()
    }
  }
  return
}
"""


def bundle(prog: ap.Program, unrolled: bool = False) -> str:
    return ap.plan(prog, target=SPYRE).bundle_mlir(unrolled=unrolled)


def executes(text: str, kernel: str) -> list[list[str]]:
    """Operand lists of every launch of ``kernel`` in order."""
    pat = rf'"apportion.execute"\(([^)]*)\) {{kernel = "{re.escape(kernel)}"'
    return [[v.strip() for v in m.split(",")] for m in re.findall(pat, text)]


def constants(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(%\w+) = arith.constant (\d+) : index", text)}


def test_fused_bundle_golden_text_verifies():
    text = bundle(ap.load(ROOT / "examples/fused.json"))
    assert text == FUSED_GOLDEN
    verify_mlir(text)


def test_fused_bundle_shape():
    text = bundle(fused())
    assert "affine_map<(d0, d1)[s0] -> (s0 + d0 * 4194304 + d1 * 2048)>" in text
    counts = re.findall(r"scf.for %\w+ = %c0 to (%\w+) step %c1", text)
    assert [constants(text)[c] for c in counts] == [2, 4]
    # y is a scratchpad offset with no address map; z is addressed in device memory
    assert "#tile_y" not in text and constants(text)["%y_lx"] == 0
    assert "#tile_z" in text and 'memory = ["lx", "hbm", "hbm"]' in text
    assert len(executes(text, "add.kernel")) == len(executes(text, "mul.kernel")) == 1


def test_symbolic_count_bounds_come_from_function_arguments():
    text = bundle(fused(("T", 4)))
    verify_mlir(text)
    assert "func.func @fused(%T: index)" in text
    assert "scf.for %i0 = %c0 to %T step %c1" in text
    assert "affine_map<(d0, d1)[s0, s1] -> (s0 + d0 * (8388608 floordiv s1) + d1 * 2048)>" \
        in text
    assert "affine.apply #tile_a(%i0, %i1)[%a_hbm, %T]" in text


def test_symbolic_count_cannot_be_unrolled():
    with pytest.raises(EmitError, match="symbolic count 'T'"):
        bundle(fused(("T", 4)), unrolled=True)


def test_unrolled_lists_every_iteration_with_advancing_addresses():
    text = bundle(fused(), unrolled=True)
    verify_mlir(text)
    assert "scf.for" not in text and "affine" not in text
    value = constants(text)
    adds = [[value[v] for v in ops] for ops in executes(text, "add.kernel")]
    muls = [[value[v] for v in ops] for ops in executes(text, "mul.kernel")]
    assert len(adds) == len(muls) == 8
    order = [(i, j) for i in range(2) for j in range(4)]
    assert [a for a, _, _ in adds] == [4194304 * i + 2048 * j for i, j in order]
    assert [b for _, b, _ in adds] == [8388608 + 4194304 * i + 2048 * j for i, j in order]
    assert {y for _, _, y in adds} == {0} and {y for y, _, _ in muls} == {0}  # lx stays put
    assert [z for _, _, z in muls] == [25165824 + 4194304 * i + 2048 * j for i, j in order]
    assert "// iteration [1, 3]" in text


def test_unrolled_per_tile_buffers_stay_fixed():
    # on 2 cores a 512 x 4096 tile of y needs 4 MiB per core: no room in the scratchpad
    planned = ap.plan(fused((2, 1)), target=ap.targets.spyre(cores=2))
    y = planned.plan.buffer("y")
    assert (y.kind, y.space) == ("tile", "hbm")
    text = planned.bundle_mlir(unrolled=True)
    verify_mlir(text)
    value = constants(text)
    adds = [[value[v] for v in ops] for ops in executes(text, "add.kernel")]
    assert [y_at for _, _, y_at in adds] == [y.offset, y.offset]
    assert [a for a, _, _ in adds] == [0, 4194304]
    assert "#tile_y" not in planned.bundle_mlir()


def test_untiled_program_has_no_loops():
    text = bundle(ap.load(ROOT / "examples/mlp.json"))
    verify_mlir(text)
    assert "scf.for" not in text and "affine" not in text
    assert [k for k in re.findall(r'kernel = "([\w.]+)"', text)] == [
        "gate.kernel", "up.kernel", "act.kernel", "glu.kernel", "down.kernel"]
    assert bundle(ap.load(ROOT / "examples/mlp.json"), unrolled=True).count("execute") == 5


def test_accumulator_init_sits_before_the_reduction_loop():
    prog = program({"x": ([256, 1024], "float16"), "w": ([1024, 512], "float16")},
                   [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]}],
                   ["h"], tiling=[{"ops": ["mm"], "loops": [{"count": 2, "dims": ["m"]},
                                                           {"count": 4, "dims": ["k"]}]}])
    text = bundle(prog)
    verify_mlir(text)
    lines = text.splitlines()
    init = next(i for i, s in enumerate(lines) if "mm.init.kernel" in s)
    loops = [i for i, s in enumerate(lines) if "scf.for" in s]
    assert loops[0] < init < loops[1]
    # the tile-sized float32 accumulator stays at one scratchpad offset; its copy-out after
    # the K loop writes the float16 result's 128 rows x 512 x 2 bytes of each outer iteration
    assert "#tile_h = affine_map<(d0)[s0] -> (s0 + d0 * 131072)>" in text
    finish = next(i for i, s in enumerate(lines) if "mm.finish.kernel" in s)
    assert finish > max(loops) and lines[finish - 2].strip() == "}"
    assert lines[finish + 1].strip() == "}"  # inside the outer loop
    assert "#tile_w = affine_map<(d0, d1)[s0] -> (s0 + d1 * 262144)>" in text
    verify_mlir(bundle(prog, unrolled=True))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("unrolled", [False, True])
def test_every_example_verifies(path, unrolled):
    prog = ap.load(path).bind()  # run-time sizes: planning
    if unrolled and any(isinstance(lv.count, str) for g in prog.tiling for lv in g.loops):
        with pytest.raises(EmitError, match="symbolic count 'T'"):  # nothing to unroll
            bundle(prog, unrolled=True)
        return
    verify_mlir(bundle(prog, unrolled=unrolled))


def test_address_map_text():
    assert address_map((4194304, 2048)) == \
        "affine_map<(d0, d1)[s0] -> (s0 + d0 * 4194304 + d1 * 2048)>"
    assert address_map((0, "8192 floordiv T")) == \
        "affine_map<(d0, d1)[s0, s1] -> (s0 + d1 * (8192 floordiv s1))>"


def test_names_are_made_valid_and_unique():
    arg = TensorArg(True, 0, "float16", [4, 64], ["m", "n"], {"hbm": 0}, tensor="x-1",
                    tile_strides=[128])
    out = TensorArg(False, 1, "float16", [4, 64], ["m", "n"], {"hbm": 4096}, tensor="1y",
                    tile_strides=[128])
    op = OpSpec("exp", False, {"m": (4, 1), "n": (64, 1)}, [arg, out], ["m"], "e")
    deeper = OpSpec("exp", False, {"m": (4, 1), "n": (64, 1)},
                    [replace(a, tile_strides=[128, 0]) for a in (arg, out)], ["m"], "e")
    text = render_bundle((LoopSpec(2, [op]), LoopSpec(2, [op, LoopSpec(3, [deeper])])),
                         "my prog")
    verify_mlir(text)
    assert "func.func @my_prog()" in text and "%_1y_hbm" in text
    with pytest.raises(EmitError, match="tile strides for 1 loop levels but sits in 2"):
        render_bundle((LoopSpec(2, [LoopSpec(3, [op])]),))


def test_verify_mlir_reports_the_diagnostic():
    with pytest.raises(EmitError, match="does not verify: .*custom op 'nope' is unknown"):
        verify_mlir("func.func @f() {\n  %x = nope\n}")
    with pytest.raises(EmitError, match="expects different type"):
        verify_mlir("func.func @f(%a: i32) {\n  scf.for %i = %a to %a step %a {\n  }\n"
                    "  return\n}")


@pytest.mark.parametrize("form", ["--bundle", "--unrolled", "--loopspec", "--loopspec-json"])
def test_cli_emit(form, capsys):
    assert main(["emit", str(ROOT / "examples/fused.json"), "--cores", "32", form]) == 0
    out = capsys.readouterr().out
    expected = {"--bundle": FUSED_GOLDEN, "--unrolled": "// iteration [1, 3]",
                "--loopspec": "LoopSpec(count=2, body=[",
                "--loopspec-json": '"format": "apportion.loopspec/1"'}[form]
    assert expected in out


def test_cli_emit_error_exits_2(tmp_path, capsys):
    path = tmp_path / "sym.json"
    path.write_text(ap.dumps(fused(("T", 4))))
    assert main(["emit", str(path), "--unrolled"]) == 2
    assert "cannot unroll" in capsys.readouterr().err


def test_unrolling_more_launches_than_the_limit_is_refused_before_any_text_is_made():
    from apportion.errors import EmitError
    from apportion.mlir.bundle import MAX_UNROLLED_LAUNCHES, render_bundle
    from apportion.schedule.loopspec_values import LoopSpec, OpSpec, TensorArg

    a = TensorArg(True, 0, "float16", [4, 64], ["m", "n"], {"hbm": 0}, tensor="a",
                  tile_strides=[0, 0])
    body = (OpSpec("exp", False, {"m": (4, 1), "n": (64, 1)}, [a], [], "e"),)
    nest = (LoopSpec(65535, (LoopSpec(65535, body),)),)
    with pytest.raises(EmitError, match=rf"lists {65535 * 65535} launches, more than "
                                        rf"{MAX_UNROLLED_LAUNCHES}"):
        render_bundle(nest, "big", unrolled=True)


# --- writes through a merge of dims ------------------------------------------------------------

@pytest.mark.parametrize("cores", [1, 8, 32])
@pytest.mark.parametrize("unrolled", [False, True])
def test_merged_writes_bundle_verifies_and_launches_at_their_allocations(cores, unrolled):
    planned = ap.plan(merged_program(), target=ap.targets.spyre(cores=cores))
    text = planned.bundle_mlir(unrolled=unrolled)
    verify_mlir(text)
    value = constants(text)
    for spec in ops_of(planned.loopspec()):  # no loops: every tensor at its allocation
        (launch,) = executes(text, spec.kernel)
        assert [value[v] for v in launch] == [a.address for a in spec.args], spec.name


def test_merged_writes_in_loops_advance_by_the_merge_times_the_stride():
    # plans the planner refuses; y2[t, 64*h+d] tiled 2 x 2 over t and h: 32 rows of 512 bytes
    # per step of t, 64 * 2 elements of 2 bytes per step of h
    planned = plan_in_loops(looped_program(symbolic=False), ap.targets.spyre(cores=8))
    text = planned.bundle_mlir()
    verify_mlir(text)
    assert "#tile_y2 = affine_map<(d0, d1)[s0] -> (s0 + d0 * 16384 + d1 * 256)>" in text
    unrolled = planned.bundle_mlir(unrolled=True)
    verify_mlir(unrolled)
    value = constants(unrolled)
    base = planned.plan.buffer("y2").offset
    got = [value[ops[-1]] for ops in executes(unrolled, "m2.kernel")]
    assert got == [base + 16384 * i + 256 * j for i in range(2) for j in range(2)]
    checks = simulated(planned)  # the specs behind both, run
    assert checks and all(c.ok for c in checks), checks
