from pathlib import Path

import pytest

from apportion.errors import ProgramError
from apportion.frontend.json_format import dumps, load, loads

EXAMPLES = sorted(Path(__file__).parents[2].joinpath("examples").glob("*.json"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_round_trip_through_print_and_parse(path):
    p = load(path)
    assert loads(dumps(p)) == p


def test_a_leading_slice_of_one_input_read_whole_by_another_round_trips():
    # x's 12 rows are read by i < 6, which z's 6 rows size whole: the dim must still be written
    p = loads("""{"tensors": {"x": {"shape": [12, 8], "dtype": "float32"},
      "z": {"shape": [6, 8], "dtype": "float32"}}, "inputs": ["x", "z"], "outputs": ["y"],
      "ops": [{"name": "a", "op": "add", "out": "y[i,j]", "ins": ["x[i,j]", "z[i,j]"],
               "dims": {"i": 6}}]}""")
    assert p.ops[0].sizes["i"] == 6
    assert loads(dumps(p)) == p


def test_missing_file_is_a_program_error():
    with pytest.raises(ProgramError, match="cannot read"):
        load("no/such/file.json")


def test_invalid_json_is_a_program_error():
    with pytest.raises(ProgramError, match="not valid JSON"):
        loads("{nope")


def test_wrong_format_version_is_rejected():
    with pytest.raises(ProgramError, match="unsupported program format"):
        loads('{"format": "apportion.program/9"}')


def test_flat_tiling_group_defaults_to_dim_zero():
    p = loads("""{"tensors": {"x": {"shape": [8, 4], "dtype": "float32"}}, "inputs": ["x"],
      "outputs": ["y"], "ops": [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}],
      "tiling": [{"ops": ["e"], "count": 2}]}""")
    assert p.tiling[0].loops[0].dims == ("i",) and p.tiling[0].loops[0].count == 2
