"""The documented limits are one list: ``docs/limits.md`` is rendered from
``apportion/limits.py``, every id code cites is listed, every listed id is cited by a
refusal somewhere, and the list only shrinks (no id beyond those known when it was made)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from apportion.limits import LIMITS, LIMITS_BY_ID, Unsupported, cite, cited, render

ROOT = Path(__file__).parents[2]
#: ``cite("id")`` and ``LIMITS_BY_ID["id"]`` in the package's code (limits.py itself aside)
USE = re.compile(r"""(?:cite\(\s*|LIMITS_BY_ID\[\s*)["']([a-z0-9-]+)["']""")
#: every id the list has ever held: a new limit is a new refusal, which the list may not grow by
#: (lift a limit, delete it here and in limits.py; never add one to pass a test)
KNOWN = frozenset({
    "iree-kind-without-mlir", "iree-op-at-outer-loop-level", "iree-fallback-in-loop-group",
    "iree-accumulate-kind", "iree-runtime-split-read", "iree-merged-write-destination",
    "iree-host-ops-with-loops", "iree-host-op-in-loop-group", "iree-host-ops-with-runtime-sizes",
    "bundle-emits-only", "bundle-static-sizes", "bundle-merged-scratchpad-tile",
    "needs-pytorch", "dtensor-needs-mesh", "dtensor-axes-in-mesh-order",
    # the cuda backend's own, when it joined the registry (issue 29): not new refusals of a
    # backend that had a run (it had none), its documented limits
    "cuda-needs-gpu", "cuda-needs-gpu-target", "cuda-one-device",
})


def cited_in_code() -> dict[str, list[str]]:
    """Each limit id the package's code cites, with the files citing it."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "apportion").rglob("*.py")):
        if path.name == "limits.py" and path.parent.name == "backends":
            continue
        for limit_id in USE.findall(path.read_text()):
            found.setdefault(limit_id, []).append(str(path.relative_to(ROOT)))
    return found


def test_docs_limits_md_is_rendered_from_the_list():
    assert (ROOT / "docs/limits.md").read_text() == render(), (
        "docs/limits.md is stale: python -c 'from apportion.limits import render; "
        "print(render(), end=\"\")' > docs/limits.md")


def test_every_cited_limit_is_documented():
    undocumented = {k: v for k, v in cited_in_code().items() if k not in LIMITS_BY_ID}
    assert not undocumented, f"cited but not in apportion/limits.py: {undocumented}"


def test_every_documented_limit_is_cited_by_a_refusal():
    never = sorted(set(LIMITS_BY_ID) - set(cited_in_code()))
    assert not never, (f"documented but cited nowhere (lifted? delete them from "
                       f"apportion/limits.py and docs/limits.md): {never}")


def test_the_list_only_shrinks():
    assert set(LIMITS_BY_ID) <= KNOWN, sorted(set(LIMITS_BY_ID) - KNOWN)
    assert len(LIMITS_BY_ID) == len(LIMITS)  # no id twice


def test_each_limit_is_one_line_naming_known_backends():
    for lim in LIMITS:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", lim.id), lim.id
        assert lim.statement and "\n" not in lim.statement and "|" not in lim.statement
        assert set(lim.backends) <= {"reference", "torch", "iree", "bundle", "dtensor",
                                      "openmp", "cuda"}
        assert lim.backends and "reference" not in lim.backends  # the reference defines meaning


def test_a_citation_is_found_again_and_an_unknown_id_fails_at_once():
    for lim in LIMITS:
        assert cited(f"op 'x': refused {cite(lim.id)}") is lim
    assert cited("op 'x': no such thing") is None
    with pytest.raises(KeyError):
        cite("no-such-limit")


def test_unsupported_names_backend_program_and_each_limit():
    e = Unsupported("bundle", "mlp", [LIMITS_BY_ID["bundle-static-sizes"]])
    assert str(e).startswith("backend 'bundle' cannot run program 'mlp': ")
    assert "[limit bundle-static-sizes, docs/limits.md]" in str(e)
    assert cited(str(e)) is LIMITS_BY_ID["bundle-static-sizes"]


def test_a_refusal_answers_the_limit_its_error_cites_and_an_error_citing_none_is_raised_again():
    from apportion.errors import ExecutionError
    from apportion.limits import refused

    error = ExecutionError(f"no loop bundle for a mesh {cite('bundle-emits-only')}")
    assert refused(error) == (LIMITS_BY_ID["bundle-emits-only"],)
    bug = ExecutionError("an emitter bug")
    with pytest.raises(ExecutionError) as raised:
        refused(bug)
    assert raised.value is bug
