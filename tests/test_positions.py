"""Positions per token, in float64, for every encoding: a padded NaFlex batch equals each image alone, shuffling a
sample's tokens with their coordinates changes nothing (and without them does: the control), a packed row equals
the separate images, keeping a subset of tokens equals a model run on exactly those, and the relative encodings'
attention logits do not move when every coordinate is shifted. Weights are perturbed away from init, where attention
is nearly uniform and positions barely move any output."""

from __future__ import annotations

import math

import pytest
import timm
import torch
from helpers import HEAD_DIM, make_encoding, naflex_batch, random_qkx
from timm.data.naflex_transforms import patchify_image

import pape_hub
from pape_hub.encodings import TokenPositions

ENCODINGS = pape_hub.list_encodings()
#: scores depend on coordinate differences only (Polar RoPE: about the tokens' own centre)
RELATIVE = ["rope", "rope_mixed", "polar_rope", "alibi", "lookhere", "pape", "pape_ri"]
IMAGES = [(32, 48), (40, 40), (24, 36)]


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.2)
    return model.eval()


@pytest.fixture(scope="module")
def images() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(3, h, w, generator=generator, dtype=torch.float64) for h, w in IMAGES]


@pytest.fixture(scope="module", params=ENCODINGS)
def model(request) -> torch.nn.Module:
    torch.manual_seed(0)
    return perturbed(timm.create_model(f"vit_t4_{request.param}", embed_dim=32, depth=2, num_heads=2,
                                       num_classes=5).double())


def test_a_padded_batch_equals_each_image_alone(model, images):
    with torch.no_grad():
        batch = model(naflex_batch(images))  # the collator's dict, as timm's scripts pass it
        for i, image in enumerate(images):
            torch.testing.assert_close(batch[i], model(image[None])[0], rtol=0, atol=1e-9)


def test_shuffling_tokens_with_their_coordinates_changes_nothing(model, images):
    batch = naflex_batch(images)
    n = int(batch["patch_valid"][0].sum())
    order = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    shuffled = {k: v.clone() for k, v in batch.items()}
    for key in ("patches", "patch_coord"):
        shuffled[key][0, :n] = batch[key][0, order]
    control = dict(batch, patches=shuffled["patches"])  # the tokens moved, their coordinates not
    with torch.no_grad():
        reference, moved, misplaced = model(batch), model(shuffled), model(control)
    torch.testing.assert_close(moved, reference, rtol=0, atol=1e-9)
    if model.pos_encoding.name != "none":  # NoPE is order-blind by definition
        assert (misplaced[0] - reference[0]).abs().max() > 1e-3


def test_keeping_a_subset_of_tokens_equals_a_model_run_on_exactly_those(model, images):
    """Dropping tokens (MAE/FLIP) by marking them invalid costs nothing extra: the result is the model's on the kept
    tokens alone, compacted into a shorter sequence."""
    batch = naflex_batch(images[:1], extra=0)
    n = batch["patches"].shape[1]
    keep = torch.randperm(n, generator=torch.Generator().manual_seed(4))[: n * 2 // 3].sort().values
    dropped = dict(batch, patch_valid=torch.zeros_like(batch["patch_valid"]))
    dropped["patch_valid"][0, keep] = True
    only = {k: v[:, keep] for k, v in batch.items()}
    with torch.no_grad():
        torch.testing.assert_close(model(dropped), model(only), rtol=0, atol=1e-9)


def test_the_patch_embedding_of_patches_is_the_convolution(model, images):
    batch = naflex_batch(images[1:2], extra=0)
    with torch.no_grad():
        tokens = model.forward_features(batch["patches"], patch_coord=batch["patch_coord"])
        grid = model.forward_features(images[1][None])
    torch.testing.assert_close(tokens, grid, rtol=0, atol=1e-9)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_packed_row_equals_the_separate_images(encoding, images):
    """Several images in one row, a block-diagonal mask between them, each pooled over its own tokens."""
    torch.manual_seed(0)
    model = perturbed(timm.create_model(f"vit_t4_{encoding}", embed_dim=32, depth=2, num_heads=2, num_classes=5,
                                        class_token=False, global_pool="avg").double())
    parts = [patchify_image(image, (4, 4))[:2] for image in images[:2]]
    packed = dict(patches=torch.cat([p for p, _ in parts])[None], patch_coord=torch.cat([c for _, c in parts])[None],
                  segment_ids=torch.cat([torch.full((len(p),), i) for i, (p, _) in enumerate(parts)])[None])
    if encoding.startswith("sape2"):  # it counts along one image's rows: refused by name
        with pytest.raises(ValueError, match="sape2 .* packed row"):
            model(packed)
        return
    with torch.no_grad():
        out = model(packed)  # (1, images, classes)
        for i, image in enumerate(images[:2]):
            torch.testing.assert_close(out[0, i], model(image[None])[0], rtol=0, atol=1e-9)


def test_a_packed_row_needs_a_model_without_prefix_tokens(images):
    model = timm.create_model("vit_t4_rope", embed_dim=32, depth=1, num_heads=2).double()
    patches, coord = patchify_image(images[0], (4, 4))[:2]
    with pytest.raises(ValueError, match="class_token=False, global_pool='avg'"):
        model(patches[None], patch_coord=coord[None], segment_ids=torch.zeros(1, len(patches), dtype=torch.long))


@pytest.mark.parametrize("encoding", RELATIVE)
def test_relative_logits_do_not_move_when_every_coordinate_is_shifted(encoding):
    """Between patch tokens (prefix tokens are not positioned, so their scores are not relative), per sample, with a
    control: a shift of one sample's coordinates by a different amount along one axis only (a stretch) moves them."""
    enc = make_encoding(encoding, grid=(4, 5), num_prefix=1)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    g = torch.Generator().manual_seed(5)
    coords = torch.randint(0, 6, (2, 12, 2), generator=g).double()
    q, k, x = random_qkx(13)

    def logits(c: torch.Tensor) -> torch.Tensor:
        pos = TokenPositions(c, 1)
        state = enc.prepare(pos)
        qk = enc.transform_qk(0, torch.stack([q, k]), x, state) if "qk" in enc.mechanisms else torch.stack([q, k])
        out = qk[0] @ qk[1].transpose(-1, -2) * HEAD_DIM**-0.5
        bias = enc.attn_bias(0, qk[0], qk[1], state) if "bias" in enc.mechanisms else None
        out = out if bias is None else out + bias
        return out[..., 1:, 1:]

    shift = torch.tensor([[3.0, 5.0], [7.0, 2.0]], dtype=torch.float64)[:, None]
    reference, shifted = logits(coords), logits(coords + shift)
    finite = torch.isfinite(reference)
    assert torch.equal(finite, torch.isfinite(shifted))
    torch.testing.assert_close(shifted[finite], reference[finite], rtol=0, atol=1e-9)
    stretched = logits(coords * torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert (stretched - reference)[finite & torch.isfinite(stretched)].abs().max() > 1e-3


def test_free_coordinates_are_refused_by_the_grid_encodings_by_name(images):
    batch = naflex_batch(images[:1], extra=0)
    for encoding, what in (("ape", "learned table of grid cells"), ("sape2", "rows and columns of a grid")):
        model = timm.create_model(f"vit_t4_{encoding}", embed_dim=32, depth=1, num_heads=2).double()
        with torch.no_grad():
            model(batch)  # whole patch indices: read
        with pytest.raises(ValueError, match=what):
            model.forward_features(batch["patches"], patch_coord=batch["patch_coord"] + 0.5)


# --- the transformers face: SigLIP2's conventions, transformers' own processor, Trainer, remote code --------------
def native_images() -> list:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in [(30, 50), (40, 40)]]


@pytest.fixture(scope="module")
def hf_model():
    from pape_hub.hf import PapeViTConfig, PapeViTForImageClassification

    torch.manual_seed(0)
    config = PapeViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           image_size=32, patch_size=4, num_labels=5, position_encoding="pape")
    return perturbed(PapeViTForImageClassification(config))


def test_siglip2_batches_from_transformers_processor_give_each_image_its_own_logits(hf_model):
    from pape_hub.hf import native_processor_for

    processor = native_processor_for(hf_model.config, max_num_patches=64)  # transformers' Siglip2ImageProcessor
    images = native_images()
    batch = processor(images, return_tensors="pt")
    assert set(batch) == {"pixel_values", "pixel_attention_mask", "spatial_shapes"}
    with torch.no_grad():
        logits = hf_model(**batch).logits
        for i, image in enumerate(images):
            alone = hf_model(**processor([image], return_tensors="pt")).logits
            torch.testing.assert_close(logits[i], alone[0], rtol=0, atol=1e-5)
        explicit = hf_model(pixel_values=batch["pixel_values"], pixel_attention_mask=batch["pixel_attention_mask"],
                            patch_coord=timm_coords(batch)).logits
    torch.testing.assert_close(explicit, logits, rtol=0, atol=1e-6)


def timm_coords(batch: dict) -> torch.Tensor:
    """(y, x) of SigLIP2's row-major tokens, written out."""
    coords = []
    for (h, w) in batch["spatial_shapes"].tolist():
        grid = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(-1, 2)
        coords.append(torch.cat([grid, grid.new_zeros(batch["pixel_values"].shape[1] - len(grid), 2)]))
    return torch.stack(coords)


def test_trainer_fine_tunes_on_native_resolution_batches(hf_model, tmp_path):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from pape_hub.hf import native_processor_for

    processor = native_processor_for(hf_model.config, max_num_patches=64)
    encoded = processor(native_images() * 4, return_tensors="np")
    data = Dataset.from_dict({**{k: list(v) for k, v in encoded.items()}, "labels": [0, 1] * 4}).with_format("torch")
    before = {n: p.detach().clone() for n, p in hf_model.named_parameters()}
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=4, max_steps=2, report_to=[], use_cpu=True,
                             save_strategy="no", disable_tqdm=True, logging_steps=1)
    try:
        trainer = Trainer(model=hf_model.train(), args=args, train_dataset=data)
        trainer.train()
        assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)
        assert any(not torch.equal(before[n], p) for n, p in hf_model.named_parameters())
    finally:
        with torch.no_grad():  # the module-scoped model, as the other tests had it
            for n, p in hf_model.named_parameters():
                p.copy_(before[n])
        hf_model.eval()


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_remote_code_takes_native_batches_without_pape_hub(hf_model, tmp_path):
    import subprocess
    import sys
    import textwrap

    from pape_hub.hf import native_processor_for

    hf_model.save_pretrained(tmp_path / "model")
    batch = native_processor_for(hf_model.config, max_num_patches=64)(native_images(), return_tensors="pt")
    torch.save(dict(batch), tmp_path / "batch.pt")
    with torch.no_grad():
        torch.save(hf_model(**batch).logits, tmp_path / "logits.pt")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["pape_hub"] = None  # not importable here
        import torch
        from transformers import AutoModelForImageClassification
        model = AutoModelForImageClassification.from_pretrained({str(tmp_path / 'model')!r},
                                                                trust_remote_code=True).eval()
        batch, expected = torch.load({str(tmp_path / 'batch.pt')!r}), torch.load({str(tmp_path / 'logits.pt')!r})
        with torch.no_grad():
            assert torch.allclose(model(**batch).logits, expected, atol=1e-6)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_timms_naflex_loader_feeds_the_model(tmp_path):
    """timm's own ``create_naflex_loader`` (what ``train.py`` / ``validate.py --naflex-loader`` build) over an image
    folder of several shapes: its dicts go straight in, each image's logits its own."""
    import numpy as np
    from PIL import Image
    from timm.data import create_dataset, create_naflex_loader

    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(3):
            h, w = rng.integers(20, 60, 2)
            Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(tmp_path / name / f"{i}.png")
    loader = create_naflex_loader(create_dataset("", root=str(tmp_path)), patch_size=(4, 4), max_seq_len=64,
                                  batch_size=3, is_training=False, use_prefetcher=False, num_workers=0,
                                  pin_memory=False)
    model = perturbed(timm.create_model("vit_t4_rope_mixed", embed_dim=32, depth=1, num_heads=2, num_classes=2))
    assert model.get_patch_size() == (4, 4) and model.embeds.patch_size == (4, 4)  # what the scripts ask
    batch, _ = next(iter(loader))
    with torch.no_grad():
        logits = model(batch)
        for i in range(3):
            keep = batch["patch_valid"][i]
            one = model(batch["patches"][i : i + 1, keep], patch_coord=batch["patch_coord"][i : i + 1, keep])
            torch.testing.assert_close(logits[i], one[0], rtol=0, atol=1e-5)


def test_forward_intermediates_takes_per_token_inputs(images):
    model = perturbed(timm.create_model("vit_t4_rope_mixed", embed_dim=32, depth=2, num_heads=2).double())
    batch = naflex_batch(images[:2])
    with torch.no_grad():
        final, hidden = model.forward_intermediates(batch, indices=[0, 1], output_fmt="NLC")
        alone = model.forward_intermediates(images[1][None], indices=[1], output_fmt="NLC", intermediates_only=True)
    n = int(batch["patch_valid"][1].sum())
    torch.testing.assert_close(hidden[1][1, :n], alone[0][0], rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match='output_fmt="NLC"'):
        model.forward_intermediates(batch)


@pytest.mark.parametrize("encoding", ["liere", "liere8"])
def test_liere_rotates_each_distinct_coordinate_once_and_every_token_by_its_own(encoding):
    """A batch of grids repeats its coordinates: LieRE computes one rotation per distinct coordinate and gathers,
    the rotations each sample's tokens get alone (float64, to rounding: a head's Taylor polynomials are one matrix
    product over its tokens), in every layer and for one layer."""
    torch.manual_seed(0)
    model = timm.create_model(f"vit_t4_{encoding}", embed_dim=32, depth=2, num_heads=2, num_classes=5).double()
    enc = model.pos_encoding
    coords = torch.tensor([[[0, 0], [0, 1], [1, 0], [2, 3]], [[2, 3], [0, 0], [1, 1], [0, 0]]], dtype=torch.float64)
    batched = enc.rotations(coords)  # (L, B, H, T, G, b, b)
    alone = torch.stack([enc.rotations(sample) for sample in coords], dim=1)
    torch.testing.assert_close(batched, alone, rtol=0, atol=1e-14)
    torch.testing.assert_close(enc.rotations(coords, layer=1), alone[1], rtol=0, atol=1e-14)
    assert not torch.equal(batched[:, 0, :, 0], batched[:, 0, :, 1])  # the control: coordinates do matter
