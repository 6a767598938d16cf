"""The text rewrites upstream MLIR's GPU lowering needs (``apportion.mlir.gpu``): pure text,
no upstream MLIR needed."""

import re

from apportion.mlir.gpu import block_mapped, block_maps, copies_as_linalg, host_shared


def test_block_mappings_become_processor_maps_and_a_fourth_grid_dim_a_loop():
    text = "{mapping = [#gpu.block<linear_dim_3>, #gpu.block<linear_dim_0>, #gpu.block<z>]}"
    got = block_maps(text)
    assert re.findall(r"processor = (\w+)", got) == ["sequential", "block_x", "block_z"]


def test_a_copy_of_strided_slices_becomes_a_linalg_copy_of_the_same_types():
    line = ("    memref.copy %sv, %sv_1 : memref<4x8xf32, strided<[16, 1], offset: ?>> to "
            "memref<4x8xf32, strided<[8, 1], offset: ?>>")
    assert copies_as_linalg(line) == (
        "    linalg.copy ins(%sv : memref<4x8xf32, strided<[16, 1], offset: ?>>) "
        "outs(%sv_1 : memref<4x8xf32, strided<[8, 1], offset: ?>>)")


def test_host_buffers_become_managed_memory_and_a_kernel_s_own_stay_on_its_heap():
    text = "\n".join([
        "  func.func @f(%n: index) {",
        "    %a = memref.alloc(%n) {alignment = 64 : i64} : memref<?xf32>",
        "    memref.dealloc %a : memref<?xf32>",
        "  }",
        "  gpu.module @k {",
        "      %t = memref.alloc() {alignment = 64 : i64} : memref<4xf32>",
        "  }"])
    got = host_shared(text)
    assert "%a = gpu.alloc host_shared (%n) : memref<?xf32>" in got
    assert re.search(r"gpu\.dealloc async \[%hs_wait\d+\] %a : memref<\?xf32>", got)
    assert "%t = memref.alloc() {alignment = 64 : i64} : memref<4xf32>" in got


def test_block_mapped_counts_every_forall_and_those_mapped_to_gpu_blocks():
    text = "\n".join([
        "%a = scf.forall (%i) in (4) shared_outs(%o = %e) -> (tensor<4xf32>) {",
        "} {mapping = [#gpu.block<x>]}",
        "%b = scf.forall (%j) in (2) shared_outs(%p = %e) -> (tensor<2xf32>) {",
        "}"])
    assert block_mapped(text) == (2, 1)
