"""The compiled-module cache runs only a module whose bytes match the digest written beside it:
a module copied over a key, a missing or a wrong digest means compile again and replace."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytest.importorskip("iree.compiler")

from apportion.backends.iree import runtime as iree  # noqa: E402

#: two small modules (no forall: compiled as they are, lower=False)
NEG = ("func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
       "  %r = arith.negf %a : tensor<4xf32>\n  return %r : tensor<4xf32>\n}\n")
ADD = ("func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
       "  %r = arith.addf %a, %a : tensor<4xf32>\n  return %r : tensor<4xf32>\n}\n")


def _compile(text: str, cache: Path) -> iree.Compiled:
    return iree.compile_mlir(text, cache, lower=False)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def cached(tmp_path: Path) -> tuple[Path, iree.Compiled]:
    """A cache folder holding NEG's module, compiled once."""
    first = _compile(NEG, tmp_path)
    assert not first.cached and first.path is not None
    return tmp_path, first


def test_a_cached_module_has_its_sha256_written_beside_it(cached) -> None:
    cache, first = cached
    assert first.path is not None
    digest = iree.digest_path(first.path)
    assert digest.name == first.path.name + ".sha256"
    assert digest.read_text() == _sha(first.path.read_bytes()) == _sha(first.vmfb)
    assert not list(cache.glob("*.tmp"))  # written through renamed temporaries
    again = _compile(NEG, cache)
    assert again.cached and again.vmfb == first.vmfb


def test_a_different_module_copied_under_the_key_is_compiled_again_never_run(cached) -> None:
    cache, first = cached
    other = _compile(ADD, cache)
    assert first.path is not None and other.path is not None and other.vmfb != first.vmfb
    first.path.write_bytes(other.vmfb)  # the key now holds ADD's module, NEG's digest
    again = _compile(NEG, cache)
    assert not again.cached  # recompiled: the mismatched module was not handed back to run
    assert again.vmfb == first.vmfb
    assert first.path.read_bytes() == first.vmfb  # and replaced in the cache
    assert iree.digest_path(first.path).read_text() == _sha(first.vmfb)
    assert _compile(NEG, cache).cached


def test_a_digest_of_other_bytes_means_compile_again(cached) -> None:
    cache, first = cached
    assert first.path is not None
    iree.digest_path(first.path).write_text(_sha(b"another module"))
    again = _compile(NEG, cache)
    assert not again.cached and again.vmfb == first.vmfb
    assert iree.digest_path(first.path).read_text() == _sha(first.vmfb)


@pytest.mark.parametrize("damage", ["missing", "empty", "garbage", "module truncated"])
def test_a_missing_or_wrong_digest_means_compile_again(cached, damage: str) -> None:
    cache, first = cached
    assert first.path is not None
    digest = iree.digest_path(first.path)
    if damage == "missing":
        digest.unlink()
    elif damage == "empty":
        digest.write_text("")
    elif damage == "garbage":
        digest.write_bytes(b"\xff\xfe not a digest")
    else:
        first.path.write_bytes(first.vmfb[: len(first.vmfb) // 2])
    again = _compile(NEG, cache)
    assert not again.cached and again.vmfb == first.vmfb
    assert digest.read_text() == _sha(first.path.read_bytes()) == _sha(first.vmfb)
