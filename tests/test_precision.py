"""Positional arithmetic stays in float32 under bf16 autocast: logits at a 4x larger grid stay finite and close
to float32 (issue: PaPE's quadratic channels grow with the grid, so they are centred and computed in float32)."""

from __future__ import annotations

import pytest
import timm
import torch

import pape_hub  # noqa: F401 - registers the models


@pytest.mark.parametrize("encoding", ["pape", "pape_ri", "rope", "rope_mixed", "liere8", "alibi", "lookhere"])
def test_bf16_autocast_at_4x_grid_matches_fp32(encoding):
    torch.manual_seed(0)
    model = timm.create_model(f"vit_t4_{encoding}", embed_dim=64, depth=2, num_heads=2).eval()
    x = torch.randn(2, 3, 128, 128)  # trained grid 8x8 -> 32x32
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x)
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
    torch.testing.assert_close(low.float(), ref, rtol=0.1, atol=0.1 * ref.abs().max().item())


def test_pape_quadratic_channels_are_centred():
    """At a 4x grid the largest position monomial is (grid/2)^2, not grid^2: what keeps bf16 exact enough."""
    model = timm.create_model("vit_t4_pape", embed_dim=64, depth=1, num_heads=2)
    pos = model.positions((32, 32), torch.device("cpu"))
    r = model.pos_encoding.token_positions(pos)
    assert r.abs().max().item() <= 16.5
