import re

import pytest

from apportion.errors import ProgramError
from tests.helpers import one_op, program

F16 = "float16"


def test_matmul_dims_are_output_first_then_reduction():
    p = one_op("matmul", "y[m,n]", ["x[m,k]", "w[k,n]"],
               {"x": ([8, 4], F16), "w": ([4, 16], F16)})
    op = p.ops[0]
    assert op.dim_names == ("m", "n", "k")
    assert op.reduction_dims == ("k",) and op.category == "matmul"
    assert p.tensor("y").shape == (8, 16) and p.tensor("y").dtype == F16


def test_letters_inside_sums_take_declared_sizes():
    p = program({"x": ([4, 256], F16)},
                [{"name": "v", "op": "copy", "out": "y[t,h,d]", "ins": ["x[t,128*h+d]"],
                  "dims": {"h": 2, "d": 128}}], ["y"])
    assert p.tensor("y").shape == (4, 2, 128)


def test_reduction_output_with_literal_zero_keeps_a_size_one_dim():
    p = one_op("sum", "r[m,0]", ["x[m,n]"], {"x": ([8, 16], F16)})
    assert p.tensor("r").shape == (8, 1) and p.ops[0].category == "reduction"


def test_argmax_output_is_int64():
    p = one_op("argmax", "r[m]", ["x[m,n]"], {"x": ([8, 16], F16)})
    assert p.tensor("r").dtype == "int64"


@pytest.mark.parametrize(("ops", "match"), [
    ([{"name": "a", "op": "frobnicate", "out": "y[i]", "ins": ["x[i]"]}], "unknown op"),
    ([{"name": "a", "op": "add", "out": "y[i]", "ins": ["x[i]"]}], "takes 2 inputs"),
    ([{"name": "a", "op": "exp", "out": "y[i]", "ins": ["q[i]"]}], "'q'"),
    ([{"name": "a", "op": "exp", "out": "y[i]", "ins": ["x[i,j]"]}], "rank 1"),
    ([{"name": "a", "op": "exp", "out": "y[i]", "ins": ["x[i]"]},
      {"name": "b", "op": "exp", "out": "y[i]", "ins": ["x[i]"]}], "defined twice"),
    ([{"name": "a", "op": "exp", "out": "y[i]", "ins": ["z[i]"]},
      {"name": "b", "op": "exp", "out": "z[i]", "ins": ["x[i]"]}], "neither an input"),
    ([{"name": "a", "op": "exp", "out": "y[i]", "ins": ["x[i]"]},
      {"name": "a", "op": "neg", "out": "z[i]", "ins": ["y[i]"]}], "used twice"),
    ([{"name": "a", "op": "exp", "out": "y[i+1]", "ins": ["x[i]"]}], "writes each index once"),
    ([{"name": "a", "op": "exp", "out": "y[i]", "ins": ["x[i+9]"], "dims": {"i": 8}}],
     "beyond its size"),
    ([{"name": "a", "op": "copy", "out": "y[i]", "ins": ["x[j]"], "dims": {"i": 4}}],
     "use a reduction"),
])
def test_malformed_program_errors_name_the_culprit(ops, match):
    with pytest.raises(ProgramError, match=match):
        program({"x": ([16], F16)}, ops, ["y"])


def test_unknown_dtype_lists_valid_ones():
    with pytest.raises(ProgramError, match="valid: float16"):
        program({"x": ([16], "float8")}, [], [])


def test_output_never_produced_is_an_error():
    with pytest.raises(ProgramError, match="never produced"):
        program({"x": ([16], F16)}, [], ["y"])


def test_size_disagreement_names_op_tensor_and_dim():
    with pytest.raises(ProgramError, match=r"op 'add'.*'i'.*tensor 'b'"):
        one_op("add", "y[i]", ["a[i]", "b[i]"], {"a": ([8], F16), "b": ([4], F16)})


def test_work_division_for_unknown_dim_is_an_error():
    with pytest.raises(ProgramError, match="unknown dim 'q'"):
        one_op("exp", "y[i]", ["x[i]"], {"x": ([8], F16)}, work_division={"exp": {"q": 2}})


def test_a_dim_alone_may_read_the_leading_part_of_a_larger_axis_but_never_write_one():
    from apportion.ir.op import Access, Op
    from apportion.ir.program import Program, TensorType

    def prog(op: Op, out_shape: tuple[int, ...]) -> Program:
        return Program("p", (TensorType("x", (4, 384), "float32"),
                             TensorType("y", out_shape, "float32")), ("x",), ("y",), (op,))

    sizes = {"t": 4, "c": 128}
    head = prog(Op.build("q", "exp", Access.parse("y[t,c]"), (Access.parse("x[t,c]"),), sizes),
                (4, 128))  # x[:, :128], a chunk
    assert head.ops[0].sizes == sizes
    with pytest.raises(ProgramError, match="dim 'c' has size 128 but indexes dim 1 of tensor 'y'"):
        prog(Op.build("q", "exp", Access.parse("y[t,c]"), (Access.parse("x[t,c]"),), sizes),
             (4, 384))
    with pytest.raises(ProgramError, match="dim 'c' has size 128 but indexes dim 1 of tensor 'x'"):
        prog(Op.build("q", "cumsum", Access.parse("y[t,c]"), (Access.parse("x[t,c]"),), sizes),
             (4, 128))  # a fallback reads whole tensors


def test_ranks_and_op_dims_past_numpys_limit_are_program_errors_not_recursion():
    """A rank-1000 tensor recursed past Python's limit in work distribution (one level per dim);
    numpy cannot hold more than 64 dims anyway, so 64 is the limit, named with the tensor or op."""
    import apportion as ap
    from apportion.ir.op import MAX_DIMS

    def deep(n: int):
        dims = ",".join(f"d{i}" for i in range(n))
        return program({"x": ([1] * n, "float32")},
                       [{"name": "e", "op": "exp", "out": f"y[{dims}]", "ins": [f"x[{dims}]"]}],
                       ["y"])

    assert all(c.ok for c in ap.plan(deep(MAX_DIMS)).check())
    with pytest.raises(ProgramError, match=r"tensor 'x' has rank 1000; at most 64 dims"):
        deep(1000)
    dims = [f"d{i}" for i in range(100)]
    with pytest.raises(ProgramError, match=r"op 'e' has 100 dims; at most 64"):
        program({"x": ([200], "float32")},
                [{"name": "e", "op": "sum", "out": "y[0]", "ins": [f"x[{'+'.join(dims)}]"],
                  "dims": dict.fromkeys(dims, 2)}], ["y"])


def _constant(op: str, dtype: str, **attrs: float):
    return program({"x": ([4, 64], dtype)},
                   [{"name": "f", "op": op, "out": "c[i,j]", "ins": [], **attrs,
                     "dims": {"i": 4, "j": 64}, "dtype": dtype},
                    {"name": "a", "op": "add", "out": "y[i,j]", "ins": ["x[i,j]", "c[i,j]"]}],
                   ["y"])


@pytest.mark.parametrize(("op", "dtype", "attrs", "value"), [
    ("fill", "int8", {"value": 300.0}, "300.0"),
    ("fill", "int8", {"value": -129.0}, "-129.0"),
    ("full", "int64", {"value": 2.0 ** 63}, "9.223372036854776e+18"),
    ("arange", "int8", {"start": 0.0, "step": 1.0}, "255.0"),  # its last value, at 4 x 64
])
def test_a_constant_an_integer_output_cannot_hold_is_refused_naming_op_value_tensor_and_range(
        op, dtype, attrs, value):
    # computed values saturate (kernels.saturate); a number the program writes is not clamped
    bits = {"int8": 8, "int64": 64}[dtype]
    want = rf"op 'f' writes {re.escape(value)}, which tensor 'c' of dtype {dtype} cannot hold "
    with pytest.raises(ProgramError, match=want + rf"\({-2 ** (bits - 1)}\.\."):
        _constant(op, dtype, **attrs)


def test_constants_an_integer_output_holds_after_truncation_are_accepted():
    _constant("fill", "int8", value=127.9)
    _constant("fill", "int8", value=-128.5)
    _constant("arange", "int32", start=0.0, step=1.0)
    _constant("fill", "float32", value=1e30)  # floats round (or overflow to inf) as numpy does
