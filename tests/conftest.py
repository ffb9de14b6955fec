"""Long tests first: with two xdist workers the suite's wall time is its CPU time over two only if no worker is left
running one long test at the end while the other is idle. The Makefile runs xdist's ``worksteal`` schedule: its default
``load`` schedule hands each worker a quarter of its share as one consecutive run at the start, so the first worker
took every long test (a run with 930 s of tests took 632 s of wall time on two workers; ``worksteal``, which takes
the other worker's last queued tests when one runs out, 494 s for 950 s of tests)."""

from __future__ import annotations

import pytest

LONG_FIRST = ("hosts", "slow", "export")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in LONG_FIRST))  # stable: order kept within
