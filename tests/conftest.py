import os

import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=25, deadline=None)
settings.register_profile("dev", max_examples=60, deadline=None)
# a long search, run by hand: HYPOTHESIS_PROFILE=soak pytest tests/passes
settings.register_profile("soak", max_examples=1000, deadline=None)
_default = "ci" if os.environ.get("CI") else "dev"
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or _default)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("CI"):
        skip = pytest.mark.skip(reason="slow test: skipped under CI=true")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)
