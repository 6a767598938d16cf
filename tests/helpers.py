"""Small program builders shared by the tests."""

from __future__ import annotations

from typing import Any

from apportion.frontend.json_format import from_dict
from apportion.ir.program import Program


def program(tensors: dict[str, tuple[list[int], str]], ops: list[dict[str, Any]],
            outputs: list[str], **extra: Any) -> Program:
    """A program from declared input tensors and op dicts in program format v1."""
    return from_dict({"format": "apportion.program/1", "name": extra.pop("name", "t"),
                      "tensors": {n: {"shape": s, "dtype": d} for n, (s, d) in tensors.items()},
                      "inputs": list(tensors), "outputs": outputs, "ops": ops, **extra})


def one_op(fn: str, out: str, ins: list[str], tensors: dict[str, tuple[list[int], str]],
           **extra: Any) -> Program:
    return program(tensors, [{"name": fn, "op": fn, "out": out, "ins": ins}],
                   [out.split("[")[0]], **extra)
