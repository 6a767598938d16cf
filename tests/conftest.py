import os

import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=25, deadline=None)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("CI"):
        skip = pytest.mark.skip(reason="slow test: skipped under CI=true")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)
