"""The Python builder: named dims, operators, reductions, matmul, hint scopes and their errors."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import apportion as ap
from apportion.errors import ProgramError
from apportion.frontend.builder import ProgramBuilder, Tensor
from apportion.frontend.builder_ops import BinaryOp, Reduction, UnaryOp
from apportion.frontend.json_format import dumps, loads
from apportion.ir import LoopLevel, Program, TilingGroup

A, B = ap.dim("A", 1024), ap.dim("B", 4096)


def fused() -> Program:
    with ap.program("fused") as p:
        a, b, c = (p.input(n, [A, B], "float16") for n in "abc")
        with ap.hint(slices={A: 2}), ap.hint(slices={B: 4}):
            y = a + b
            z = y * c
        p.output(z)
    return p.program


def softmax() -> Program:
    with ap.program("softmax") as p:
        x = p.input("x", [A, B], "float32")
        with ap.hint(slices={A: 4}):
            m = ap.amax(x, B)
            e = ap.exp(x - m)
            y = e / ap.sum(e, B)
        p.output(y)
    return p.program


def test_example_gives_two_ops_in_one_group_with_outer_and_inner_levels() -> None:
    prog = fused()
    assert [o.name for o in prog.ops] == ["add0", "mul1"]
    assert [o.fn for o in prog.ops] == ["add", "mul"]
    assert prog.tiling == (TilingGroup(("add0", "mul1"),
                                       (LoopLevel(2, ("A",)), LoopLevel(4, ("B",)))),)
    assert {t.shape for t in prog.tensors} == {(1024, 4096)}
    assert prog.inputs == ("a", "b", "c") and prog.outputs == ("mul1_out",)
    assert str(prog.ops[1]) == "mul1: mul1_out[A, B] = mul(add0_out[A, B], c[A, B])"


def test_softmax_over_rows_reduces_b_keeping_it_as_size_one() -> None:
    prog = softmax()
    assert [o.fn for o in prog.ops] == ["max", "sub", "exp", "sum", "div"]
    assert [o.category for o in prog.ops] == ["reduction", "pointwise", "pointwise", "reduction",
                                         "pointwise"]
    assert prog.tensor("amax0_out").shape == (1024, 1)
    assert str(prog.ops[1]) == "sub1: sub1_out[A, B] = sub(x[A, B], amax0_out[A, 0])"
    assert prog.ops[3].reduction_dims == ("B",)
    assert prog.tensor(prog.outputs[0]).shape == (1024, 4096)
    assert prog.tiling == (TilingGroup(tuple(o.name for o in prog.ops), (LoopLevel(4, ("A",)),)),)


@pytest.mark.parametrize("make", [fused, softmax])
def test_program_round_trips_through_json_to_an_equal_program(make: Callable[[], Program]) -> None:
    prog = make()
    assert loads(dumps(prog)) == prog


def test_round_trip_keeps_symbolic_counts_pins_casts_and_argmax_dtype() -> None:
    with ap.program("misc") as p:
        x = p.input("x", [A, B], "float16")
        with ap.hint(slices={A: "n"}, work_division={B: 8}):
            y = ap.cast(ap.silu(x), "float32")
        p.output(ap.argmax(y, B, keepdim=False))
    prog = p.program
    assert prog.tiling[0].loops == (LoopLevel("n", ("A",)),)
    assert prog.pins == {"silu0": {"B": 8}, "cast1": {"B": 8}}
    assert prog.tensor("cast1_out").dtype == "float32"
    arg = prog.tensor("argmax2_out")
    assert (arg.dtype, arg.shape) == ("int64", (1024,))
    assert loads(dumps(prog)) == prog


def test_letters_are_sanitised_dim_names_unique_in_the_program() -> None:
    with ap.program("names") as p:
        x = p.input("x", [ap.dim("seq len", 2), ap.dim("seq_len", 3), ap.dim("2d", 4), 5], "int32")
        p.output(ap.neg(x))
    assert str(p.program.ops[0].out) == "neg0_out[seq_len, seq_len2, d2d, d5]"


def test_anonymous_int_dims_get_generated_names_and_match_a_named_dim_of_that_size() -> None:
    with ap.program("anon") as p:
        x = p.input("x", [A, 4096], "float16")
        y = p.input("y", [A, B], "float16")
        z = x + y
    assert x.dims[1].name == "_4096" and x.dims[1].anonymous
    assert z.dims == (A, B)


def test_broadcast_reads_size_one_and_missing_dims_with_index_zero_or_not_at_all() -> None:
    with ap.program("bcast") as p:
        col = p.input("col", [A, 1], "float16")
        row = p.input("row", [B], "float16")
        x = p.input("x", [A, B], "float16")
        y = col * x + row
        p.output(y)
    ops = p.program.ops
    assert y.dims == (A, B)
    assert str(ops[0]) == "mul0: mul0_out[A, B] = mul(col[A, 0], x[A, B])"
    assert str(ops[1]) == "add1: add1_out[A, B] = add(mul0_out[A, B], row[B])"


@pytest.mark.parametrize(("fn", "ir_fn"), [
    (ap.exp, "exp"), (ap.log, "log"), (ap.sqrt, "sqrt"), (ap.rsqrt, "rsqrt"), (ap.tanh, "tanh"),
    (ap.sigmoid, "sigmoid"), (ap.relu, "relu"), (ap.silu, "silu"), (ap.gelu, "gelu"),
    (ap.neg, "neg")])
def test_unary_functions_emit_their_pointwise_op(fn: UnaryOp, ir_fn: str) -> None:
    with ap.program("u") as p:
        y = fn(p.input("x", [A], "float32"))
    assert p.program.ops[0].fn == ir_fn and y.dims == (A,)


@pytest.mark.parametrize(("fn", "ir_fn"), [
    (ap.add, "add"), (ap.sub, "sub"), (ap.mul, "mul"), (ap.div, "div"), (ap.maximum, "max"),
    (ap.minimum, "min")])
def test_binary_functions_emit_their_pointwise_op_with_a_chosen_name(fn: BinaryOp,
                                                                     ir_fn: str) -> None:
    with ap.program("b") as p:
        x = p.input("x", [A], "float32")
        fn(x, x, name="mine")
    assert (p.program.ops[0].name, p.program.ops[0].fn) == ("mine", ir_fn)


@pytest.mark.parametrize(("fn", "ir_fn"), [
    (ap.sum, "sum"), (ap.mean, "mean"), (ap.amax, "max"), (ap.amin, "min"), (ap.argmax, "argmax")])
def test_reductions_keep_the_dim_by_default_and_drop_it_with_keepdim_false(
        fn: Reduction, ir_fn: str) -> None:
    with ap.program("r") as p:
        x = p.input("x", [A, B], "float32")
        kept, dropped = fn(x, A), fn(x, A, keepdim=False)
    assert kept.shape == (1, 4096) and dropped.dims == (B,)
    assert [(o.fn, o.category) for o in p.program.ops] == [(ir_fn, "reduction")] * 2


def test_matmul_contracts_last_dim_of_x_with_first_dim_of_w() -> None:
    T, H, F = ap.dim("T", 8), ap.dim("H", 16), ap.dim("F", 32)
    with ap.program("mlp") as p:
        x, w = p.input("x", [T, H], "float16"), p.input("w", [H, F], "float16")
        h = x @ w
        p.output(ap.silu(h))
    assert h.dims == (T, F)
    op = p.program.ops[0]
    assert str(op) == "matmul0: matmul0_out[T, F] = matmul(x[T, H], w[H, F])"
    assert op.reduction_dims == ("H",)


def test_a_dim_repeated_in_one_op_gets_a_second_letter() -> None:
    S, D = ap.dim("S", 16), ap.dim("D", 8)
    with ap.program("attn") as p:
        q, k = p.input("q", [S, D], "float16"), p.input("k", [D, S], "float16")
        scores = q @ k
        r = ap.sum(scores, 1)
        p.output(r)
    ops = p.program.ops
    assert str(ops[0]) == "matmul0: matmul0_out[S, S_2] = matmul(q[S, D], k[D, S_2])"
    assert str(ops[1]) == "sum1: sum1_out[S, 0] = sum(matmul0_out[S, S_2])"
    assert loads(dumps(p.program)) == p.program


def test_generated_op_names_are_fn_and_counter_and_unique() -> None:
    with ap.program("n") as p:
        x = p.input("x", [A], "float32")
        ap.exp(x, name="exp1")
        ap.exp(x)
        ap.exp(x)
    assert [o.name for o in p.program.ops] == ["exp1", "exp2", "exp3"]


def test_leaving_a_hint_scope_or_an_op_without_hints_ends_the_group() -> None:
    with ap.program("groups") as p:
        x = p.input("x", [A, B], "float32")
        with ap.hint(slices={A: 2}):
            y = ap.exp(x)                  # group 1, outer loop only
            with ap.hint(slices={B: 4}):
                y = ap.log(y)              # group 1, inner loop: [(2, A), (4, B)]
            y = ap.relu(y)                 # group 1, outer loop only
        y = ap.tanh(y)                     # no group
        with ap.hint(slices={A: 2}):
            y = ap.exp(y)                  # group 2: a new scope with the same hint
        p.output(y)
    assert [(g.ops, [lv.count for lv in g.loops], g.depths) for g in p.program.tiling] == [
        (("exp0", "log1", "relu2"), [2, 4], (("exp0", 1), ("relu2", 1))), (("exp4",), [2], ())]


def test_an_op_not_using_a_hinted_dim_is_allowed_when_another_op_of_the_group_uses_it() -> None:
    with ap.program("partly") as p:
        x, v = p.input("x", [A, B], "float32"), p.input("v", [B], "float32")
        with ap.hint(slices={A: 2}):
            w = ap.exp(v)
            y = x * w
        p.output(y)
    assert p.program.tiling == (TilingGroup(("exp0", "mul1"), (LoopLevel(2, ("A",)),)),)


def test_hint_on_a_dim_no_op_of_the_group_uses_names_the_dim() -> None:
    C = ap.dim("C", 7)
    with ap.program("unused") as p:
        x = p.input("x", [A, B], "float32")
        with ap.hint(slices={C: 2}):
            ap.exp(x)
    with pytest.raises(ProgramError, match=r"no op of tiling group \['exp0'\] uses dim 'C'"):
        _ = p.program


def test_work_division_on_a_dim_no_op_inside_uses_names_the_dim() -> None:
    with ap.program("unused") as p:
        v = p.input("v", [B], "float32")
        with ap.hint(work_division={A: 2}):
            ap.exp(v)
    with pytest.raises(ProgramError, match=r"no op inside uses dim 'A'"):
        _ = p.program


def test_hint_needs_an_active_program_and_one_count_per_level() -> None:
    with pytest.raises(ProgramError, match="inside `with ap.program"), ap.hint(slices={A: 2}):
        pass
    with pytest.raises(ProgramError, match="nest hints for different counts"):
        ap.hint(slices={A: 2, B: 4})
    with pytest.raises(ProgramError, match="loop count must be positive"):
        ap.hint(slices={A: 0})


def test_scopes_are_restored_after_an_error_inside_them() -> None:
    with pytest.raises(ProgramError), ap.program("bad") as p:
        x = p.input("x", [A, B], "float32")
        with ap.hint(slices={A: 2}):
            ap.sum(x, ap.dim("C", 3))
    with ap.program("next") as q:
        q.output(ap.exp(q.input("x", [A], "float32")))
    assert q.program.tiling == ()
    with pytest.raises(ProgramError, match="inside `with ap.program"), ap.hint(slices={A: 2}):
        pass


def test_adding_tensors_with_mismatched_dims_names_op_tensors_and_dims() -> None:
    C = ap.dim("C", 4096)
    with ap.program("bad") as p:
        x, y = p.input("x", [A, B], "float16"), p.input("y", [A, C], "float16")
        with pytest.raises(ProgramError, match=r"op 'add0': tensor 'x' .* tensor 'y' .* dim B=4096 "
                                               r"vs dim C=4096 at axis 1"):
            _ = x + y


def test_matmul_with_mismatched_contraction_dims_names_both() -> None:
    C = ap.dim("C", 64)
    with ap.program("bad") as p:
        x, w = p.input("x", [A, B], "float16"), p.input("w", [C, A], "float16")
        with pytest.raises(ProgramError, match=r"op 'mm': .* dim B=4096 of tensor 'x' vs first "
                                               r"dim C=64 of tensor 'w'"):
            ap.matmul(x, w, name="mm")


def test_using_a_tensor_from_another_program_names_both_programs() -> None:
    with ap.program("one") as p1:
        x = p1.input("x", [A], "float16")
    with ap.program("two") as p2:
        y = p2.input("y", [A], "float16")
        with pytest.raises(ProgramError, match=r"op 'add0': tensor 'y' belongs to program 'two', "
                                               r"not 'one'"):
            _ = x + y
        with pytest.raises(ProgramError, match=r"tensor 'x' belongs to program 'one'"):
            p2.output(x)


def test_reduction_over_a_dim_the_tensor_lacks_names_op_tensor_and_dim() -> None:
    with ap.program("bad") as p:
        x = p.input("x", [A], "float16")
        with pytest.raises(ProgramError, match=r"op 'sum0': tensor 'x' \[A=1024\] has no dim 'B'"):
            ap.sum(x, B)


def test_a_dim_name_reused_with_another_size_is_an_error() -> None:
    with ap.program("bad") as p:
        p.input("x", [A], "float16")
        with pytest.raises(ProgramError, match=r"tensor 'y': dim 'A' has size 8 here but 1024"):
            p.input("y", [ap.dim("A", 8)], "float16")


@pytest.mark.parametrize(("build", "message"), [
    (lambda p, x: x + 1.0, r"op 'add0': 1.0 is not a tensor; scalar constants"),
    (lambda p, x: x + p.input("h", [A], "float32"), r"'x' \(float16\) and 'h' \(float32\)"),
    (lambda p, x: p.input("x", [A], "float16"), r"tensor 'x': name already used"),
    (lambda p, x: ap.exp(x, name="e") + ap.exp(x, name="e"), r"op 'e': name already used"),
    (lambda p, x: ap.dim("_A", 2), r"reserved for anonymous dims"),
    (lambda p, x: p.input("z", [A], "float8"), r"tensor 'z': unknown dtype 'float8'"),
    (lambda p, x: p.input("z", [A, 0], "float16"), r"tensor 'z': axis 1 must be a Dim or a pos"),
])
def test_other_misuses_raise_program_errors_naming_the_culprit(
        build: Callable[[ProgramBuilder, Tensor], object], message: str) -> None:
    with ap.program("bad") as p:
        x = p.input("x", [A], "float16")
        with pytest.raises(ProgramError, match=message):
            build(p, x)


def test_a_closed_program_takes_no_more_ops_inputs_or_outputs() -> None:
    with ap.program("done") as p:
        x = p.input("x", [A], "float16")
        p.output(ap.exp(x))
    ops = len(p.program.ops)
    with pytest.raises(ProgramError, match=r"op 'neg1' on tensor 'x': program 'done' is closed"):
        _ = -x
    with pytest.raises(ProgramError, match="program 'done' is closed"):
        p.input("z", [A], "float16")
    with pytest.raises(ProgramError, match="program 'done' is closed"):
        p.output(x)
    with pytest.raises(ProgramError, match="program 'done' is closed"), p:
        pass
    assert len(p.program.ops) == ops


@pytest.mark.parametrize("bad", ['a"b', "a b", "a\\b", "a,b", "a[0]", ""])
def test_names_that_emitted_text_cannot_hold_are_refused_at_input(bad: str) -> None:
    from tests.helpers import program

    with pytest.raises(ProgramError, match="name"):
        program({"x": ([4], "float16")},
                [{"name": bad, "op": "exp", "out": "y[i]", "ins": ["x[i]"]}], ["y"])
    with pytest.raises(ProgramError, match="name"), ap.program(bad):
        pass


def test_merge_writes_consecutive_dims_through_one_axis_and_runs_like_a_reshape():
    import numpy as np

    from apportion.runtime import random_inputs, run_unplanned

    T, H, D, N = ap.dim("T", 16), ap.dim("H", 4), ap.dim("D", 32), ap.dim("N", 64)
    HD = ap.dim("HD", 128)
    with ap.program("heads") as p:
        o = p.input("o", [T, H, D], "float32")
        w = p.input("w", [HD, N], "float32")
        y = ap.merge(o, (H, D), HD) @ w
        p.output(y)
    merge_op = p.program.ops[0]
    assert str(merge_op.out) == "merge0_out[T, 32*H+D]" and merge_op.merges_output
    xs = random_inputs(p.program, seed=0)
    want = xs["o"].reshape(16, 128) @ xs["w"]
    np.testing.assert_allclose(run_unplanned(p.program, xs)[y.name], want, rtol=1e-5)
    import apportion

    planned = apportion.plan(p.program, apportion.targets.spyre(cores=8))
    assert all(c.ok for c in planned.check())


@pytest.mark.parametrize(("dims", "into", "match"), [
    ("HT", None, "not consecutive dims"),
    ("H", None, "two or more dims"),
    ("HD", 100, "gives 128 elements, but dim"),
])
def test_merge_refuses_dims_that_are_not_a_consecutive_run_or_a_wrong_size(dims, into, match):
    T, H, D = ap.dim("T", 16), ap.dim("H", 4), ap.dim("D", 32)
    pick = {"T": T, "H": H, "D": D}
    with ap.program("bad") as p:
        o = p.input("o", [T, H, D], "float32")
        with pytest.raises(ProgramError, match=match):
            ap.merge(o, [pick[c] for c in dims], None if into is None else ap.dim("X", into))
