"""Precision under bf16 autocast at a 4x larger grid: logits stay finite and close to float32 (PaPE's quadratic
channels grow with the grid, so they are centred), and, measured against float64, where a content projection may run
in bf16 (issue "GPU": float32 only where bf16 loses accuracy)."""

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


def autocast_error(encoding: str, float32_projection: bool, seeds: int = 16, size: int = 128) -> float:
    """Mean over seeds of the largest logit error under bf16 autocast, relative to the float64 model (trained grid
    8x8, here 32x32: 4x), with the query channels' content projection in float32 or in bf16."""
    errors = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = timm.create_model(f"vit_t4_{encoding}", embed_dim=64, depth=2, num_heads=2).eval()
        x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            reference = model.double()(x.double())
            model.float().pos_encoding.float32_projection = float32_projection
            with torch.autocast("cpu", dtype=torch.bfloat16):
                low = model(x)
        errors.append(float((low.double() - reference).abs().max() / reference.abs().max()))
    return sum(errors) / len(errors)


@pytest.mark.parametrize("encoding", ["pape", "pape_ri"])
def test_the_content_projection_runs_in_bf16_where_float64_says_it_loses_nothing(encoding):
    """The decision behind ``float32_projection``: at 4x the training grid, in float64, a bf16 content projection
    adds error PaPE's quadratic channels carry into attention (its attention drifts a quarter further from
    float64) and nothing measurable to PaPE-RI's. So PaPE keeps it in float32 and PaPE-RI runs it in bf16; either
    way q and k meet in attention in bf16."""
    from pape_hub.encodings import encoding_class

    ratio = autocast_error(encoding, False) / autocast_error(encoding, True)
    keeps_float32 = encoding_class(encoding)[0].float32_projection
    assert (ratio > 1.15) == keeps_float32, f"{encoding}: bf16 / float32 projection error {ratio:.3f}"
