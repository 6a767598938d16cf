"""Argmax keys in MLIR (``mlir.keys``), the one rendering the mesh modules and the shard forms
share, compiled and run by IREE: bit for bit the keys and indices of numpy's
``schedule.mesh.argmax_keys`` and ``argmax_index``, NaNs, signed zeros, infinities and ties
included, for a device's part of a wider reduction."""

from __future__ import annotations

import numpy as np
import pytest

from apportion.backends.iree import runtime as iree
from apportion.mlir.keys import pack_key, unpack_index
from apportion.mlir.shard.body import Block
from apportion.mlir.types import MLIR_TYPES
from apportion.schedule.mesh import argmax_index, argmax_keys

#: the device's part of the reduction (3x4 of an 8x16 one, starting at row 2, column 5)
LOCAL, STARTS, SIZES = (3, 4), (2, 5), (8, 16)
N = 12
VALUES = {
    # no float32 subnormal: IREE's CPU code flushes them, so their keys there are zero's
    "float32": [np.nan, -0.0, 0.0, np.inf, -np.inf, 1.5, 1.5, -2.0, 3.4e38, -np.nan, 1.2e-38,
                0.1],
    "float16": [np.nan, -0.0, 0.0, np.inf, -np.inf, 1.5, 1.5, -2.0, 65504.0, -np.nan, 6e-8, 0.1],
    "bfloat16": [np.nan, -0.0, 0.0, np.inf, -np.inf, 1.5, 1.5, -2.0, 2.0**127, -np.nan, 1.0,
                 0.5],
    "int8": [-128, 127, 0, -1, 1, 5, 5, -7, 100, -100, 3, 2],
    "int32": [-2**31, 2**31 - 1, 0, -1, 1, 5, 5, -7, 10**9, -10**9, 3, 2],
}


def _body(reserved: tuple[str, ...]) -> Block:
    b = Block(indent=2)
    for name in reserved:
        b.fresh(name)
    return b


def _module(elt: str) -> str:
    packing = _body(("v", "i", "o"))
    key = pack_key(packing, "%v", elt, "%i", "i64", LOCAL, STARTS, SIZES)
    unpacking = _body(("k", "o"))
    index = unpack_index(unpacking, "%k")
    t, ti = f"tensor<{N}x{elt}>", f"tensor<{N}xi64>"
    ident = "affine_map<(d0) -> (d0)>"
    head = '{indexing_maps = [%s], iterator_types = ["parallel"]}'
    return "\n".join([
        f"func.func @keys(%values: {t}, %local: {ti}) -> ({ti}, {ti}) {{",
        f"  %empty = tensor.empty() : {ti}",
        f"  %keys = linalg.generic {head % ', '.join([ident] * 3)} "
        f"ins(%values, %local : {t}, {ti}) outs(%empty : {ti}) {{",
        f"  ^bb0(%v: {elt}, %i: i64, %o: i64):", packing.text(), f"    linalg.yield {key} : i64",
        f"  }} -> {ti}",
        f"  %index = linalg.generic {head % ', '.join([ident] * 2)} "
        f"ins(%keys : {ti}) outs(%empty : {ti}) {{",
        "  ^bb0(%k: i64, %o: i64):", unpacking.text(), f"    linalg.yield {index} : i64",
        f"  }} -> {ti}",
        f"  return %keys, %index : {ti}, {ti}",
        "}"])


@pytest.mark.parametrize("dtype", sorted(VALUES))
def test_keys_packed_in_mlir_are_numpy_s_keys_bit_for_bit_and_unpack_to_the_global_index(
        dtype, tmp_path):
    elt = MLIR_TYPES[dtype]
    host = np.float32 if dtype == "bfloat16" else np.dtype(dtype)
    values = np.array(VALUES[dtype], dtype=host)
    local = np.arange(N, dtype=np.int64)
    rows, cols = np.unravel_index(local, LOCAL)
    flat = (rows + STARTS[0]) * SIZES[1] + cols + STARTS[1]  # where each sits in the whole
    compiled = iree.compile_mlir(_module(elt), tmp_path)
    keys, index = iree.run_vmfb(compiled.vmfb, "keys", [(values, elt), (local, "i64")],
                                ["i64", "i64"]).outputs
    np.testing.assert_array_equal(keys, argmax_keys(values, flat))
    np.testing.assert_array_equal(index, argmax_index(keys))
    np.testing.assert_array_equal(index, flat)
