"""Long tests first: with two xdist workers the suite's wall time is its CPU time over two only if no worker is left
running one long test at the end while the other is idle."""

from __future__ import annotations

import pytest

LONG_FIRST = ("hosts", "slow", "export")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in LONG_FIRST))  # stable: order kept within
