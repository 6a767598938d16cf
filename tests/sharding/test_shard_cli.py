"""``apportion emit PROG --mesh SPEC --shard-form FORM``: each form printed after upstream MLIR
verified it; refusals are one line with exit status 2."""

from __future__ import annotations

import pytest

from apportion.cli.main import main
from apportion.mlir.upstream import MISSING, available

pytestmark = pytest.mark.skipif(not available(), reason=MISSING)


def _run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("form", ["annotated", "propagated", "partitioned", "unrolled"])
def test_emit_prints_each_shard_form_starting_with_the_grid(capsys, form):
    status, out, _ = _run(capsys, "emit", "examples/mlp.json", "--mesh", "dp=2,tp=2",
                          "--shard-form", form)
    assert status == 0 and out.startswith("shard.grid @mesh(shape = 2x2)")
    assert f'apportion.form = "{form}"' in out


def test_a_symbolic_mesh_is_emitted_with_a_dynamic_axis_and_partitioned_once_bound(capsys):
    status, out, _ = _run(capsys, "emit", "examples/megatron.json", "--mesh", "tp=N~2..4",
                          "--shard-form", "annotated")
    assert status == 0 and out.startswith("shard.grid @mesh(shape = ?)")
    status, _, err = _run(capsys, "emit", "examples/megatron.json", "--mesh", "tp=N~2..4",
                          "--shard-form", "partitioned")
    assert status == 2 and err.count("\n") == 1 and "--param N=SIZE" in err
    status, out, _ = _run(capsys, "emit", "examples/megatron.json", "--mesh", "tp=N~2..4",
                          "--param", "N=3", "--shard-form", "partitioned")
    assert status == 0 and out.startswith("shard.grid @mesh(shape = 3)")


def test_a_shard_form_needs_a_mesh(capsys):
    status, _, err = _run(capsys, "emit", "examples/mlp.json", "--shard-form", "annotated")
    assert status == 2 and err.startswith("apportion: error: ") and "--mesh" in err
