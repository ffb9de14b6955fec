"""GPU-readiness measured on the CPU (issue "GPU"): on a GPU at small batches eager kernels are launch-bound, so
the aten calls of a forward are the cost to hold down; under bf16 autocast no matrix product may stay float32 unless
a precision test says so. The counts are device-independent; `python -m lab profile` writes them for ViT-B/16 into
results/profile_vit_b16_224_cpu.json and this test holds every encoding to them (a model 128 wide with 2 heads of
64 and 12 layers makes exactly ViT-B/16's calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch

import pape_hub
from lab.commands.profile import CALLS_LIMIT, FLOAT32_UNDER_AUTOCAST, OVER_LIMIT, forward_calls

ROOT = Path(__file__).resolve().parent.parent
RECORDED = json.loads((ROOT / "results" / "profile_vit_b16_224_cpu.json").read_text())["rows"]


def calls(encoding: str) -> dict[str, float]:
    torch.manual_seed(0)
    model = timm.create_model(f"vit_t4_{encoding}", embed_dim=128, depth=12, num_heads=2, img_size=32).eval()
    return forward_calls(model, torch.randn(1, 3, 32, 32))


@pytest.fixture(scope="module")
def ape() -> int:
    return calls("ape")["calls"]


@pytest.mark.parametrize("encoding", pape_hub.list_encodings())
def test_calls_per_forward_stay_where_they_are(encoding, ape):
    counted = calls(encoding)
    recorded = RECORDED[encoding]["autocast"]
    assert counted["calls"] <= 1.1 * recorded["calls"], f"{encoding}: {counted['calls']} calls, {recorded['calls']} " \
        "recorded (more than 10% more)"
    if encoding not in OVER_LIMIT:
        assert counted["calls"] <= CALLS_LIMIT * ape, f"{encoding}: {counted['calls'] / ape:.2f}x APE's calls"


@pytest.mark.parametrize("encoding", pape_hub.list_encodings())
def test_no_float32_matmul_under_autocast_unless_a_precision_test_keeps_it(encoding):
    share = calls(encoding)["float32_matmul_share"]
    if encoding in FLOAT32_UNDER_AUTOCAST:
        assert 0 < share <= 1.1 * RECORDED[encoding]["autocast"]["float32_matmul_share"]
    else:
        assert share == 0, f"{encoding}: {100 * share:.2f}% of its matrix-product FLOPs in float32 under autocast"


def test_the_limit_is_measured_against_what_the_readme_says():
    """The encodings over the limit are exactly the ones the profile command names, with a reason."""
    over = {e for e, row in RECORDED.items() if row["autocast"]["calls"] > CALLS_LIMIT * RECORDED["ape"]["autocast"][
        "calls"]}
    assert over == set(OVER_LIMIT) and all(OVER_LIMIT.values())


@pytest.mark.parametrize("train", [False, True])
def test_the_gpu_memory_probe_runs_through_on_the_cpu(monkeypatch, train):
    """`python -m lab memory --device cuda` is only run where a GPU is lent: its probe's own steps (autocast, the
    optimizer, one row per size) run here with torch's CUDA statistics stood in, so a GPU lease is not spent on a
    Python error."""
    import argparse

    from lab.commands.memory import gpu_probe

    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, **kwargs: None)
    allocated = iter(range(0, 1 << 40, 1 << 20))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *args: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *args: next(allocated))
    args = argparse.Namespace(device="cpu", dtype="auto", size="t", train=train, batch_size=2, inference_batch_size=1,
                              repeats=1)
    rows = gpu_probe("rope_mixed", [32, 48], args)
    assert set(rows) == {"32", "48"} and all(row["peak_mb"] >= 0 and row["time_s"] > 0 for row in rows.values())
