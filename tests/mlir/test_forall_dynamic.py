"""The parallel IR of programs with run-time sizes: one function for every size (``?`` dims read
with ``tensor.dim``, split-K slices from an ``arith.select`` chain, slices cut from the run-time
sizes), compiled once by IREE and run at sizes that take different branches of the chain,
against the given program run unplanned at those sizes; ops writing through a merge of dims
among them.

Each compiled module costs about half a second, so these are a handful of small programs, each
compiled once (a module cache per test) and run at two or three sizes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import apportion as ap
from apportion.backends.iree import runtime as iree
from apportion.backends.iree.run import iree_run
from apportion.cli.main import main
from apportion.errors import ExecutionError
from apportion.frontend.json_format import from_dict
from apportion.mlir.builder import Block, Builder
from apportion.mlir.forall import verify_mlir
from apportion.mlir.forall.sizes import select
from apportion.mlir.index import Ix
from apportion.planned import PlannedProgram
from apportion.target.split_k import Case, SelectChain
from tests.backends.iree.emitting import emit
from tests.backends.sums import DYNAMIC as SUMS
from tests.helpers import bound, checked
from tests.runtime_reductions import PROGRAMS as RUNTIME_REDUCTIONS
from tests.runtime_reductions import SIZES as RUNTIME_SIZES
from tests.runtime_reductions import planned as runtime_planned

ROOT = Path(__file__).parents[2]


def dynk(m: int | str = 32, k_max: int = 65536) -> dict:
    symbols = {"K": {"max": k_max}} | ({"M": {"max": 64}} if isinstance(m, str) else {})
    return {"name": "dynk", "symbols": symbols,
            "tensors": {"x": {"shape": [m, "K"], "dtype": "float32"},
                        "w": {"shape": ["K", 32], "dtype": "float32"}},
            "inputs": ["x", "w"], "outputs": ["y"],
            "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]",
                     "ins": ["x[m,k]", "w[k,n]"]}]}


#: reductions over a run-time size: a sum and a mean (split-K with a select chain on gpu, the
#: mean divided by a run-time count) and argmax (value-index pairs, split inside the op)
REDUCTIONS = {
    "name": "dred", "symbols": {"N": {"max": 8192}},
    "tensors": {"x": {"shape": [16, "N"], "dtype": "float32"}},
    "inputs": ["x"], "outputs": ["s", "a", "i"],
    "ops": [{"name": "sum", "op": "sum", "out": "s[m]", "ins": ["x[m,k]"]},
            {"name": "avg", "op": "mean", "out": "a[m]", "ins": ["x[m,k]"]},
            {"name": "arg", "op": "argmax", "out": "i[m]", "ins": ["x[m,k]"]}]}

#: pointwise over a run-time size, on a grid of two split dims
POINTWISE = {
    "name": "dpw", "symbols": {"N": {"max": 4096}},
    "tensors": {"x": {"shape": [8, "N"], "dtype": "float16"},
                "z": {"shape": [8, "N"], "dtype": "float16"}},
    "inputs": ["x", "z"], "outputs": ["y"],
    "ops": [{"name": "e", "op": "add", "out": "y[m,n]", "ins": ["x[m,n]", "z[m,n]"]}]}

#: a run-time M (a parallel dim): matmul then relu, M cut unevenly
PARALLEL = {
    "name": "dm", "symbols": {"M": {"max": 512}},
    "tensors": {"x": {"shape": ["M", 64], "dtype": "float32"},
                "w": {"shape": [64, 32], "dtype": "float32"}},
    "inputs": ["x", "w"], "outputs": ["z"],
    "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
            {"name": "r", "op": "relu", "out": "z[m,n]", "ins": ["y[m,n]"]}]}


#: writes through a merge of dims beside run-time sizes: a matmul whose K is split at run time
#: (on gpu a select chain) writing its partials and result through 64*h+d, and an exp writing
#: through 64*h+d over a run-time M (a merged write itself never has a run-time size)
MERGED = {
    "name": "dmerge", "symbols": {"K": {"max": 65536}, "M": {"max": 64}},
    "tensors": {"a": {"shape": ["M", 2, "K"], "dtype": "float32"},
                "b": {"shape": [2, "K", 64], "dtype": "float32"},
                "x": {"shape": ["M", 4, 64], "dtype": "float32"},
                "o": {"shape": ["M", 128], "dtype": "float32"},
                "y": {"shape": ["M", 256], "dtype": "float32"}},
    "inputs": ["a", "b", "x"], "outputs": ["o", "y"],
    "ops": [{"name": "mm", "op": "matmul", "out": "o[t,64*h+d]", "ins": ["a[t,h,k]", "b[h,k,d]"]},
            {"name": "m", "op": "exp", "out": "y[t,64*h+d]", "ins": ["x[t,h,d]"]}]}

def planned(doc: dict, target: str = "gpu", cores: int | None = None) -> PlannedProgram:
    return ap.plan(from_dict(doc), ap.targets.resolve(target, cores))


def run_at(p: PlannedProgram, sizes: list[dict[str, int]], cache: Path) -> None:
    """Check ``p`` in IREE at each of ``sizes``: one compile, then cache hits."""
    for i, at in enumerate(sizes):
        checks, run = checked(p, lambda s, xs: iree_run(s, xs, cache), params=at)
        bad = [c for c in checks if not c.ok]
        assert checks and not bad, (at, bad)
        assert run.cached == (i > 0), at  # the module covers every size
    assert len(list(cache.glob("*.vmfb"))) == 1


# --- the text ------------------------------------------------------------------------------

def test_a_symbolic_reduction_emits_one_function_with_a_select_chain():
    p = planned(dynk())
    text = p.forall_mlir()  # verifies
    assert text.startswith("func.func @dynk(%x: tensor<32x?xf32>, %w: tensor<?x32xf32>) -> "
                           "tensor<32x32xf32> {")
    assert "%K = tensor.dim %x, %c1 : tensor<32x?xf32>" in text
    # the chain from its last case backwards: the first case (128 slices) is the last select
    selects = re.findall(r"(%mm_slices\w*) = arith.select %\w+, %c(\d+), (%\w+) : index", text)
    chain = p.plan.op("mm.partial").split_k.select
    assert [int(f) for _, f, _ in selects] == [c.factor for c in reversed(chain.cases)]
    assert selects[0][2] == "%c1" and selects[-1][0] == "%mm_slices"  # default 1 first
    assert "arith.remui %K, %c4096 : index" in text and "arith.cmpi uge, %K, %c1536" in text
    assert "%mm_step = arith.divui %K, %mm_slices : index" in text
    assert "tensor.empty(%mm_slices) : tensor<?x32x32xf32>" in text
    assert ("tensor.expand_shape %x [[0], [1, 2]] output_shape [32, %mm_slices, %mm_step] : "
            "tensor<32x?xf32> into tensor<32x?x?xf32>") in text
    # the partial op's forall keeps the plan's 128 threads; the combine reads F slices
    assert re.search(r"scf\.forall \(%mm\.partial_k_slice\) in \(128\)", text)


def test_static_programs_emit_no_run_time_sizes():
    static = ap.plan(ap.load(ROOT / "examples/mlp.json"), ap.targets.spyre(cores=8))
    text = static.forall_mlir()
    assert emit(static.program, static.plan, static.target, symbolic=static.program) \
        == text
    assert "?" not in text and "tensor.dim" not in text


def test_cli_emit_forall_covers_every_size(tmp_path, capsys):
    path = tmp_path / "dynk.json"
    path.write_text(json.dumps(dynk()))
    assert main(["emit", str(path), "--target", "gpu", "--forall"]) == 0
    assert capsys.readouterr().out == planned(dynk()).forall_mlir()


def test_a_size_no_input_has_is_an_index_argument():
    doc = {"name": "bc", "symbols": {"N": {"max": 256}},
           "tensors": {"x": {"shape": [16], "dtype": "float32"},
                       "y": {"shape": [16, "N"], "dtype": "float32"}},
           "inputs": ["x"], "outputs": ["y"],
           "ops": [{"name": "r", "op": "relu", "out": "y[m,n]", "ins": ["x[m]"]}]}
    p = planned(doc, "cpu", 2)
    assert p.forall_mlir().startswith("func.func @bc(%x: tensor<16xf32>, %N: index) -> "
                                      "tensor<16x?xf32> {")


# --- the select chain, as IREE computes it ----------------------------------------------------

def test_the_select_chain_picks_the_first_case_holding_k(tmp_path):
    chains = [
        planned(dynk()).plan.op("mm.partial").split_k.select,
        SelectChain("K", (Case(4, lo=100, hi=199, multiple=4), Case(2, multiple=2),
                          Case(8, lo=50), Case(3)), default=1),
        SelectChain("K", (Case(16, hi=64, multiple=16), Case(5, lo=1000, hi=1999)), default=7),
    ]
    em = Builder()
    body = Block(em, 1)
    k = Ix.atom("%K")
    results = [body.value(select(body, c, k, f"f{i}")) for i, c in enumerate(chains)]
    types = ", ".join("index" for _ in results)
    text = "\n".join([f"func.func @chains(%K: index) -> ({types}) {{", *em.const_lines,
                      *body.lines, f"  return {', '.join(results)} : {types}", "}"]) + "\n"
    verify_mlir(text)
    vmfb = iree.compile_mlir(text, tmp_path).vmfb
    sizes = [1, 2, 3, 4, 16, 50, 51, 64, 100, 101, 102, 104, 198, 199, 200, 1000, 1001, 1535,
             1536, 2048, 4096, 8192, 40960, 40961, 65536, 10_000_000, 10_000_001]
    for size in sizes:
        out = iree.run_vmfb(vmfb, "chains", [(size, "index")], ["i64"] * len(chains)).outputs
        assert [int(o) for o in out] == [c.evaluate(size) for c in chains], size


# --- compiled once, run at several sizes --------------------------------------------------------

@pytest.mark.parametrize("target", ["gpu", "cpu", "spyre"])
def test_a_symbolic_matmul_runs_at_every_size_from_one_module(target, tmp_path):
    p = planned(dynk(), target, 8 if target == "cpu" else None)
    sizes = [{"K": 40960}, {"K": 1000}]
    if target == "gpu":  # the chain's two ends: 128 slices of 320, and K left whole
        assert [p.bound(s)[1].op("mm.partial").split_k.factor for s in sizes] == [128, 1]
    run_at(p, sizes, tmp_path)


def test_the_cpu_table_chain_splits_a_matrix_vector_product_at_run_time(tmp_path):
    doc = dynk(k_max=16384)
    doc["tensors"] = {"x": {"shape": [1, "K"], "dtype": "float32"},
                      "w": {"shape": ["K", 1024], "dtype": "float32"}}
    p = planned(doc, "cpu", 8)
    sizes = [{"K": 2048}, {"K": 1000}]
    assert [p.bound(s)[1].op("mm.partial").split_k.factor for s in sizes] == [8, 1]
    run_at(p, sizes, tmp_path)


@pytest.mark.parametrize("target", ["gpu", "spyre"])
def test_reductions_over_a_run_time_size(target, tmp_path):
    p = planned(REDUCTIONS, target)
    if target == "gpu":
        assert p.plan.op("sum.partial").split_k.select is not None
    run_at(p, [{"N": 8192}, {"N": 1000}, {"N": 3}], tmp_path)


def test_a_pointwise_op_over_a_run_time_size_on_a_grid_of_two_dims(tmp_path):
    p = planned(POINTWISE, "spyre")
    assert sum(n > 1 for _, n in p.plan.op("e").splits) == 2
    assert re.search(r"scf\.forall \(%e_core\) in \(\d+\)", p.forall_mlir())
    run_at(p, [{"N": 4096}, {"N": 100}, {"N": 1}], tmp_path)


def test_a_run_time_parallel_dim(tmp_path):
    p = planned(PARALLEL, "spyre")
    assert p.forall_mlir().startswith("func.func @dm(%x: tensor<?x64xf32>, %w: "
                                      "tensor<64x32xf32>) -> tensor<?x32xf32> {")
    run_at(p, [{"M": 512}, {"M": 37}, {"M": 1}], tmp_path)


@pytest.mark.parametrize("target", ["gpu", "spyre"])
def test_merged_writes_beside_run_time_sizes(target, tmp_path):
    p = planned(MERGED, target)
    text = p.forall_mlir()  # verifies
    assert "tensor.expand_shape %y_init [[0], [1, 2]] output_shape [%M, 4, 64] : " \
        "tensor<?x256xf32> into tensor<?x4x64xf32>" in text
    if target == "gpu":  # the partials of a run-time slice count, split
        assert p.plan.op("mm.partial").split_k.select is not None
        assert "tensor<?x?x128xf32> into tensor<?x?x2x64xf32>" in text
    run_at(p, [{"K": 40960, "M": 5}, {"K": 1000, "M": 64}, {"K": 3, "M": 1}], tmp_path)

@pytest.mark.parametrize("target", ["gpu", "spyre"])
def test_reads_through_a_sum_of_three_dims_beside_a_run_time_size(target, tmp_path):
    # x[t, 64*a+32*c+d] over a run-time M: gathered into tensors of a run-time size
    p = planned(SUMS, target)
    assert "tensor.extract %x" in p.forall_mlir()
    run_at(p, [{"M": 64}, {"M": 37}, {"M": 1}], tmp_path)

@pytest.mark.parametrize("name", list(RUNTIME_REDUCTIONS))
def test_a_gpu_reduction_over_several_dims_beside_a_run_time_size_runs_at_every_size(
        name, tmp_path):
    # static reduction dims cut (several of one op for the run-time rows), K left whole
    run_at(runtime_planned(name), [{"K": k} for k in RUNTIME_SIZES], tmp_path)

def test_a_pinned_cut_of_a_run_time_dim_beside_a_static_one_reads_through_a_view(tmp_path):
    # K cut into 4 slices of K/4 (a run-time step: an expand_shape of x's K axis) and j into 2
    doc = {"name": "pin2", "symbols": {"K": {"min": 1, "max": 64}},
           "tensors": {"x": {"shape": [8, "K", 128], "dtype": "float32"}},
           "inputs": ["x"], "outputs": ["y"],
           "ops": [{"name": "r", "op": "sum", "out": "y[m]", "ins": ["x[m,k,j]"]}],
           "split_k": {"r": {"slices": {"k": 4, "j": 2}}}}
    p = planned(doc)
    assert p.plan.op("r.partial").split_k.per_dim == {"k": 4, "j": 2}
    assert "tensor<8x?x128xf32> into tensor<8x4x?x128xf32>" in p.forall_mlir()
    run_at(p, [{"K": 64}, {"K": 12}, {"K": 4}], tmp_path)

# --- the entry points ---------------------------------------------------------------------------

@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))  # the default module cache under it
    return tmp_path / ".cache" / "apportion" / "iree"


def test_planned_run_and_check_and_the_cli_on_the_iree_backend(home, capsys):
    p = planned(dynk(m="M"), "cpu", 2)
    assert all(c.ok for c in p.check(backend="iree", params={"K": 512, "M": 5}))
    xs = {"x": np.ones((3, 64), np.float32), "w": np.full((64, 32), 0.5, np.float32)}
    out = p.run(xs, backend="iree")  # the sizes from the inputs' shapes
    assert out["y"].shape == (3, 32) and np.all(out["y"] == 32.0)
    assert len(list(home.glob("*.vmfb"))) == 1
    with pytest.raises(ExecutionError, match="input 'x' dim 1 has size 64, but the sizes "
                                             "given make it 128"):
        iree_run(bound(p, {"K": 128}, inputs=xs), xs, home)
    with pytest.raises(ExecutionError, match="'K' = 70000 is outside its bounds"):
        checked(p, lambda s, xs: iree_run(s, xs, home), params={"K": 70000})
    static = ap.plan(ap.load(ROOT / "examples/mlp.json"), ap.targets.cpu(cores=2))
    with pytest.raises(ExecutionError, match="has no symbolic sizes"):
        iree_run(static.schedule({"M": 4}), {})

    path = home.parent / "dynk.json"
    path.write_text(json.dumps(dynk(m="M")))
    args = ["run", str(path), "--target", "cpu", "--cores", "2", "--backend", "iree"]
    capsys.readouterr()
    assert main([*args, "--check", "--param", "K=4096", "--param", "M=7"]) == 0
    out = capsys.readouterr().out
    assert "K=4096 (given)" in out and "matches the unplanned program" in out
    assert "taken from the cache" in out  # the module check() compiled
    assert main([*args, "--param", "K=100"]) == 0


#: a run-time T read transposed: the relayout copy the planner adds has a run-time axis too
TRANSPOSED = {
    "name": "dtr", "symbols": {"T": {"max": 512}},
    "tensors": {"x": {"shape": ["T", 64], "dtype": "float16"},
                "w": {"shape": [64, "T"], "dtype": "float16"}},
    "inputs": ["x", "w"], "outputs": ["y"],
    "ops": [{"name": "e", "op": "exp", "out": "e[t,j]", "ins": ["x[t,j]"]},
            {"name": "tr", "op": "add", "out": "y[j,t]", "ins": ["e[t,j]", "w[j,t]"]}]}


def test_a_relayout_copy_of_a_run_time_size_is_sized_at_run_time(tmp_path):
    p = planned(TRANSPOSED, "spyre")
    assert "e.relayout0" in [o.name for o in p.ops]
    run_at(p, [{"T": 512}, {"T": 37}, {"T": 1}], tmp_path)


def test_a_loop_group_over_a_run_time_size_compiles_once_and_runs_at_every_size(tmp_path):
    # loops nested over a dynamically shaped carried tensor: IREE sees its shape only through
    # the flow.tensor.tie_shape that lower_forall adds ("'tensor.dim' op unexpected" without)
    doc = {"name": "dyn", "symbols": {"S": {"min": 256, "max": 2048}},
           "tensors": {"x": {"shape": ["S", 1024], "dtype": "float16"},
                       "b": {"shape": ["S", 1024], "dtype": "float16"}},
           "inputs": ["x", "b"], "outputs": ["y"],
           "ops": [{"name": "add", "op": "add", "out": "h[m,n]", "ins": ["x[m,n]", "b[m,n]"]},
                   {"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["h[m,n]"]}],
           "tiling": [{"ops": ["add", "e"], "loops": [{"count": 4, "dims": ["m"]}]}]}
    p = planned(doc, "spyre")
    assert "flow.tensor.tie_shape" in iree.lower_forall(p.forall_mlir())
    run_at(p, [{"S": 2048}, {"S": 1024}, {"S": 512}], tmp_path)
