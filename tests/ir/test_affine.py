import pytest

from apportion.errors import ProgramError
from apportion.ir.affine import AffineExpr, IndexingMap


def test_parse_affine_sum_with_coefficients_and_constant():
    e = AffineExpr.parse("128*h + d + 5")
    assert e.terms == (("h", 128), ("d", 1)) and e.const == 5
    assert e.to_source() == "128*h+d+5"


def test_extent_of_compound_index_spans_all_terms():
    assert AffineExpr.parse("128*h+d").extent({"h": 2, "d": 128}) == 256


@pytest.mark.parametrize("bad", ["", "h*2", "-1", "2*", "a+a"])
def test_malformed_index_expression_is_an_error(bad):
    with pytest.raises(ProgramError):
        AffineExpr.parse(bad)


def test_indexing_map_prints_mlir_style():
    m = IndexingMap.permutation(("m", "n", "k"), (0, 2))
    assert str(m) == "(m, n, k) -> (m, k)"
    assert m.used_dims == ("m", "k")


def test_indexing_map_rejects_unknown_dim():
    with pytest.raises(ProgramError, match="'z'"):
        IndexingMap(("m",), (AffineExpr.dim("z"),))
