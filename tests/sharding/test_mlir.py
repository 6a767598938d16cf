"""MLIR: the per-device programs are emitted as IREE modules, each verified (the shard-dialect
forms, verified by upstream MLIR 22, are tested in test_shard_forms.py)."""

from __future__ import annotations

from apportion.frontend.json_format import load
from apportion.mlir.mesh import mesh_mlir
from apportion.sharding.lower import lower_mesh
from apportion.sharding.mesh import parse
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding
from apportion.sharding.unroll import unroll


def test_per_device_programs_are_emitted_as_verified_parallel_ir_with_collectives_between():
    rep = Sharding(((), ()))
    plan = search(load("examples/megatron.json"), parse("tp=2"),
                  annotations={"x": Sharding((("tp",), ())), "y": rep})
    text = mesh_mlir(lower_mesh(unroll(plan)))
    modules = text.split("// -----\n")
    assert len(modules) == 2
    for d, module in enumerate(modules):
        assert module.startswith(f"// device {d} (tp={d}) of mesh tp=2")
        assert f"func.func @megatron.d{d}.s" in module and "scf.forall" in module
        assert "// collective: x@1 = all_gather(tp) dim 0(x) over devices [0, 1]" in module
        assert "all_reduce(sum, tp)" in module
