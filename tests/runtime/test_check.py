"""The one check of a planned run (``runtime.check``): the program run unplanned (``expect``),
then planned by the caller on the same inputs, every output compared (``Expected.compare``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from apportion.errors import ExecutionError
from apportion.runtime import check as checking
from apportion.runtime.check import expect, tensors_of
from apportion.runtime.reference import random_inputs, run_unplanned
from tests.helpers import program


def scale_program():
    return program({"x": ([4, 8], "float32")},
                   [{"name": "s", "op": "mul", "out": "y[i,j]", "ins": ["x[i,j]", "x[i,j]"]}],
                   ["y"])


@dataclass(frozen=True)
class Record:
    """A backend's run record: its tensors and how long it took."""

    tensors: dict[str, np.ndarray]
    run_s: float


def test_a_run_record_that_matches_passes_on_the_random_inputs_of_the_seed():
    p = scale_program()
    want = expect(p, seed=4)
    np.testing.assert_array_equal(want.inputs["x"], random_inputs(p, 4)["x"])
    checks = want.compare(Record(run_unplanned(p, want.inputs), 0.5))
    assert [c.tensor for c in checks] == ["y"] and all(c.ok for c in checks)


def test_a_wrong_output_fails_naming_it():
    p = scale_program()
    checks = expect(p, seed=1).compare({"y": np.zeros((4, 8), np.float32)})
    assert [(c.tensor, c.ok) for c in checks] == [("y", False)]


def test_the_expectation_is_the_unplanned_run_so_a_refused_input_is_refused_before_any_run():
    p = program({"t": ([5, 8], "float16"), "ids": ([3], "int32")},
                [{"name": "g", "op": "gather", "out": "e[i,d]", "ins": ["t[v,d]", "ids[i]"]}],
                ["e"])
    xs = random_inputs(p, 0)
    xs["ids"] = np.array([0, 7, 1], dtype=np.int32)
    with pytest.raises(ExecutionError, match="op 'g'"):
        expect(p, inputs=xs)


def test_expected_outputs_given_are_not_computed_again(monkeypatch):
    p = scale_program()
    xs = random_inputs(p, 2)
    want = run_unplanned(p, xs)
    monkeypatch.setattr(checking, "run_unplanned", lambda *a: pytest.fail("ran unplanned"))
    expected = expect(p, inputs=xs, expected=want)
    assert all(c.ok for c in expected.compare(dict(want)))


def test_the_tensors_of_a_mapping_a_program_run_or_a_mesh_run():
    @dataclass(frozen=True)
    class MeshRun:
        outputs: dict[str, int]

    assert tensors_of({"y": 1}) == {"y": 1}
    assert tensors_of(Record({"y": 2}, 0.0)) == {"y": 2}
    assert tensors_of(MeshRun({"y": 3})) == {"y": 3}
