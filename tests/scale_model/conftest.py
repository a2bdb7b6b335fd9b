"""Scale-model tests: CPU groups need root and cgroup v1 (as in CI); without them they skip, saying why."""

from __future__ import annotations

import pytest

from dorylus_py.cgroups import sweep, unavailable


def pytest_collection_modifyitems(config, items):
    why = unavailable()
    for item in items:
        if why and "cgroups" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"{why}: the scale model's hosts need it"))


@pytest.fixture(autouse=True)
def no_stale_groups():
    """Whatever a test leaves (a killed run's groups) goes: groups whose maker is gone are swept."""
    yield
    if not unavailable():
        sweep()
