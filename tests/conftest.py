import os

import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=25, deadline=None)
settings.register_profile("dev", max_examples=60, deadline=None)
# a long search, run by hand: HYPOTHESIS_PROFILE=soak pytest tests/passes
settings.register_profile("soak", max_examples=1000, deadline=None)
_default = "ci" if os.environ.get("CI") else "dev"
# the cpu target's split-K table: the shipped one, the same on every machine, so that no test
# (nor a CLI it starts) measures this host's on first use; tests of the host's table inject a
# measurer and a cache folder (apportion.target.host.injected) and set it back to "host"
os.environ.setdefault("APPORTION_CPU_SPLIT_K", "shipped")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or _default)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("CI"):
        skip = pytest.mark.skip(reason="slow test: skipped under CI=true")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)
