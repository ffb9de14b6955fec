"""Point clouds and event streams (issue 36), in float64 with weights away from init: a padded batch equals each
input alone, permuting the points or events changes nothing, shifting every coordinate (points in space, events in
time) leaves the relative encodings' logits unchanged (and moves an absolute one's: the control), and PaPE-RI's
attention logits do not move under a 3-D rotation of the token coordinates (PaPE's and RoPE's do)."""

from __future__ import annotations

import math

import pytest
import timm
import torch
from helpers import logits, make_encoding, random_qkx

import pape_hub
from pape_hub.encodings import TokenPositions
from pape_hub.layers.event_patches import spiking_patches
from pape_hub.layers.point_groups import farthest_point_sample
from pape_hub.models.eventvit import EventVisionTransformer
from pape_hub.models.free_tokens import free_coordinate_encodings
from pape_hub.models.pointvit import PointVisionTransformer

ENCODINGS = free_coordinate_encodings()
#: scores depend on coordinate differences only (Polar RoPE: about the tokens' own centre; NoPE: on none)
RELATIVE = ["none", "alibi", "pape", "pape_ri", "rope", "rope_mixed", "polar_rope"]
#: absolute: a shift moves the logits (LieRE's generators do not commute, so its rotations of two positions depend on
#: more than their difference)
ABSOLUTE = ["sincos", "liere", "liere8"]
TINY = dict(embed_dim=32, depth=2, num_heads=2, num_classes=5, class_token=False, global_pool="avg")
SENSOR = (32, 32)


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.2)
    return model.double().eval()


@pytest.fixture(scope="module", params=[(f, e) for f in ("points", "events") for e in ENCODINGS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def model(request) -> tuple[str, torch.nn.Module]:
    family, name = request.param
    torch.manual_seed(0)
    if family == "points":
        return family, perturbed(PointVisionTransformer(num_groups=12, group_size=6, position_encoding=name, **TINY))
    return family, perturbed(EventVisionTransformer(sensor_size=SENSOR, event_patch_size=8, threshold=4,
                                                    time_scale=10.0, nominal_duration=100.0, position_encoding=name,
                                                    **TINY))


def clouds() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(n, 3, generator=generator, dtype=torch.float64) * 0.5 for n in (80, 57, 9)]


def streams() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    out = []
    for n in (150, 90, 23):
        xy = torch.randint(0, SENSOR[0], (n, 2), generator=generator).double()
        t = torch.rand(n, 1, generator=generator, dtype=torch.float64) * 100
        p = torch.randint(0, 2, (n, 1), generator=generator).double() * 2 - 1
        out.append(torch.cat([xy, t, p], dim=-1))
    return out


def padded(samples: list[torch.Tensor], extra: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples padded to the longest (+ ``extra``) with junk values, and the validity mask."""
    length = max(len(s) for s in samples) + extra
    batch = torch.full((len(samples), length, samples[0].shape[-1]), 7.0, dtype=torch.float64)
    valid = torch.zeros(len(samples), length, dtype=torch.bool)
    for i, s in enumerate(samples):
        batch[i, : len(s)], valid[i, : len(s)] = s, True
    return batch, valid


def test_a_padded_batch_equals_each_input_alone(model):
    family, model = model
    samples = clouds() if family == "points" else streams()
    with torch.no_grad():
        batch = model(*padded(samples))
        for i, sample in enumerate(samples):
            torch.testing.assert_close(batch[i], model(sample[None])[0], rtol=0, atol=1e-9)


def test_permuting_the_input_changes_nothing(model):
    family, model = model
    sample = clouds()[0] if family == "points" else streams()[0]
    order = torch.randperm(len(sample), generator=torch.Generator().manual_seed(3))
    moved = sample.clone()
    moved[0, 0] += 3.0 if family == "events" else 0.3  # control: one element elsewhere is another input
    with torch.no_grad():
        reference, permuted, control = model(sample[None]), model(sample[order][None]), model(moved[None])
    torch.testing.assert_close(permuted, reference, rtol=0, atol=1e-9)
    assert (control - reference).abs().max() > 1e-6


def shifted(family: str, sample: torch.Tensor) -> torch.Tensor:
    """Points moved in space; events moved in time (their pixels stay)."""
    shift = torch.tensor([0.9, -1.3, 0.6] if family == "points" else [0.0, 0.0, 37.3, 0.0], dtype=torch.float64)
    return sample + shift


def test_a_shift_leaves_relative_encodings_logits_unchanged(model):
    family, model = model
    sample = clouds()[0] if family == "points" else streams()[0]
    with torch.no_grad():
        before, after = model(sample[None]), model(shifted(family, sample)[None])
    name = model.pos_encoding.name
    if name in RELATIVE:
        torch.testing.assert_close(after, before, rtol=0, atol=1e-9)
    else:  # the control: absolute positions see the shift
        assert name in ABSOLUTE
        assert (after - before).abs().max() > 1e-6


def rotation_3d(seed: int = 4) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    q = q * torch.diagonal(r).sign()
    return q if torch.det(q) > 0 else -q


@pytest.mark.parametrize("name", ["pape_ri", "alibi", "pape", "rope", "rope_mixed", "liere8"])
def test_pape_ri_logits_are_unchanged_by_a_3d_rotation(name):
    """PaPE-RI (and ALiBi's distances) are rotation invariant in 3-D; the directional encodings are the control."""
    enc = make_encoding(name, grid=(4, 4, 4), num_prefix=1)
    coords = torch.rand(10, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 4
    q, k, x = random_qkx(11)
    turned = coords @ rotation_3d().T + torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    before = logits(enc, TokenPositions(coords, 1), q, k, x)[..., 1:, 1:]
    after = logits(enc, TokenPositions(turned, 1), q, k, x)[..., 1:, 1:]
    if name in ("pape_ri", "alibi"):
        torch.testing.assert_close(after - after.mean(-1, keepdim=True), before - before.mean(-1, keepdim=True),
                                   rtol=0, atol=1e-9)  # each row up to a constant: the softmax sees no change
    else:
        assert ((after - after.mean(-1, keepdim=True)) - (before - before.mean(-1, keepdim=True))).abs().max() > 1e-4


def test_sampling_starts_at_the_point_nearest_the_centroid_and_skips_padding():
    xyz = torch.tensor([[[5.0, 0, 0], [0.1, 0, 0], [-4.0, 0, 0], [9.0, 9, 9], [0.0, 3, 0]]])
    valid = torch.tensor([[True, True, True, False, True]])
    index, real = farthest_point_sample(xyz, 5, valid)
    assert index[0, :4].tolist() == [1, 0, 2, 4]  # start near the centroid, then farthest first; 3 is padding
    assert real[0].tolist() == [True, True, True, True, False]


def test_spiking_patches_count_every_event_once():
    events = streams()[0]
    histogram, cells, times = spiking_patches(events, SENSOR, 8, 4)
    assert histogram.sum() * 4 == pytest.approx(len(events))
    assert (histogram.sum(-1) * 4 <= 4 + 1e-9).all() and bool((times[1:] >= times[:-1]).all())
    assert cells.min() >= 0 and cells.max() < SENSOR[0] // 8


def test_events_off_the_sensor_are_refused_with_the_fix():
    model = EventVisionTransformer(sensor_size=SENSOR, event_patch_size=8, **TINY)
    with pytest.raises(ValueError, match="sensor_size"):
        model(torch.tensor([[[40.0, 3.0, 1.0, 1.0]]]))


@pytest.mark.parametrize("family", ["pointvit", "eventvit"])
def test_timm_builds_every_encoding_that_takes_free_coordinates(family):
    names = pape_hub.list_pape_models(family)
    assert {n.rsplit("_m_", 1)[1] for n in names if "_m_" in n} == set(ENCODINGS)
    assert {n.split("_")[1] for n in names} == {"t", "s", "m"}
    model = timm.create_model(f"{family}_m_pape_ri", num_classes=3)
    x = torch.randn(1, 200, 3) if family == "pointvit" else torch.tensor([[[1.0, 2.0, 5.0, 1.0]] * 70])
    assert model(x).shape == (1, 3)


@pytest.mark.parametrize("name", ["ape", "rope_ape", "sape2", "lookhere", "rope_dinov3"])
def test_encodings_without_free_coordinates_are_refused_by_name(name):
    with pytest.raises(ValueError, match=rf"{name}' cannot take part: it (reads a learned table|is defined for 2-D)"):
        PointVisionTransformer(position_encoding=name, **TINY)
    assert not any(n.endswith(f"_{name}") for n in pape_hub.list_pape_models("pointvit"))


def test_point_tokens_are_translation_invariant_in_content():
    """The stem's tokens see points relative to their centre: a shift moves positions only."""
    model = PointVisionTransformer(num_groups=8, group_size=5, **TINY).double()
    cloud = clouds()[0][None]
    tokens, coords, _ = model.patch_embed(cloud)
    tokens2, coords2, _ = model.patch_embed(cloud + 1.5)
    torch.testing.assert_close(tokens2, tokens, rtol=0, atol=1e-10)
    torch.testing.assert_close(coords2 - coords, torch.full_like(coords, 1.5 * model.patch_embed.coord_scale))
    assert math.isclose(model.patch_embed.coord_scale, 4.0)


@pytest.mark.parametrize("name", ["pape_ri", "alibi", "none", "pape", "rope_mixed"])
def test_rotation_invariant_groups_with_pape_ri_make_the_whole_model_rotation_invariant(name):
    """Distances and dot products in the stem, PaPE-RI (or ALiBi) in attention, average pooling without CLS: a cloud
    in any pose gives the same logits. PaPE's and RoPE-Mixed's directions are the control."""
    torch.manual_seed(0)
    model = perturbed(PointVisionTransformer(num_groups=12, group_size=6, rotation_invariant_groups=True,
                                             position_encoding=name, **TINY))
    cloud = clouds()[0]
    with torch.no_grad():
        before, after = model(cloud[None]), model((cloud @ rotation_3d(7).T)[None])
    if name in ("pape_ri", "alibi", "none"):
        torch.testing.assert_close(after, before, rtol=0, atol=1e-12)
    else:  # float64 rounding is ~1e-15: PaPE's small but real directional term stands far above it
        assert (after - before).abs().max() > 1e-9
