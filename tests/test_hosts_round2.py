"""Exactly like the hosts, round 2: each item of the issue driven by the host's own client - transformers' Trainer
and image processor, timm's eval transform and ``hf-hub:repo@REV`` loader, ``save_pretrained(max_shard_size=...)`` -
and the split names ``datasets`` and timm use."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import pape_hub
from pape_hub.folder import DataConfig

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=16,
             patch_size=4, num_labels=5)


# --- 1. Trainer's loss contract -----------------------------------------------------------------------------------
def test_the_loss_takes_trainers_item_count():
    from pape_hub.hf import PapeViTConfig, PapeViTForImageClassification

    torch.manual_seed(0)
    model = PapeViTForImageClassification(PapeViTConfig(**SMALL))
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    mean = model(pixel_values=x, labels=y).loss
    summed = model(pixel_values=x, labels=y, num_items_in_batch=torch.tensor(8)).loss
    torch.testing.assert_close(summed, mean * 4 / 8)  # sum / 8, not the batch mean


def first_logged_loss(accumulation: int, folder: Path) -> float:
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from pape_hub.hf import PapeViTConfig, PapeViTForImageClassification

    torch.manual_seed(0)
    model = PapeViTForImageClassification(PapeViTConfig(**SMALL))
    g = torch.Generator().manual_seed(1)
    data = Dataset.from_dict({"pixel_values": torch.randn(32, 3, 16, 16, generator=g).numpy(),
                              "labels": torch.randint(0, 5, (32,), generator=g).numpy()}).with_format("torch")
    args = TrainingArguments(str(folder), per_device_train_batch_size=8 // accumulation, logging_steps=1,
                             gradient_accumulation_steps=accumulation, max_steps=1, report_to=[], use_cpu=True,
                             learning_rate=0.0, save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)


def test_trainer_logs_the_same_first_loss_with_gradient_accumulation(tmp_path):
    """The report: with 4 accumulation steps the first logged loss was 4.61 where the native ViT logs 1.08. One
    optimizer step over the same 8 images, in 1 or 4 micro-batches, logs one loss."""
    whole, accumulated = first_logged_loss(1, tmp_path / "a"), first_logged_loss(4, tmp_path / "b")
    assert math.isclose(whole, accumulated, rel_tol=1e-4), (whole, accumulated)
    assert 1.0 < whole < 2.5  # about ln(5) at initialisation: a mean loss, not a sum


# --- 2. one preprocessing for both faces --------------------------------------------------------------------------
def registered_data_configs() -> list[DataConfig]:
    """Every distinct data config the zoo and the converted entries register (size, crop, mode, interpolation)."""
    seen = {}
    for name in pape_hub.list_pape_models("vit") + pape_hub.list_pretrained():
        cfg = timm.models.get_pretrained_cfg(name).to_dict()
        key = (tuple(cfg["input_size"]), cfg.get("crop_pct"), cfg.get("crop_mode"), cfg.get("interpolation"))
        if key not in seen:
            seen[key] = DataConfig.from_pretrained_cfg(cfg)
    return list(seen.values())


def best_shift_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference of two (C, H, W) crops, allowing the one-pixel crop offset of an odd margin (transformers
    rounds it down, torchvision to even): compared on the interior both windows share."""
    best = math.inf
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            h, w = a.shape[1] - abs(dy), a.shape[2] - abs(dx)
            sa = a[:, max(dy, 0):max(dy, 0) + h, max(dx, 0):max(dx, 0) + w]
            sb = b[:, max(-dy, 0):max(-dy, 0) + h, max(-dx, 0):max(-dx, 0) + w]
            best = min(best, float((sa - sb).abs().max()))
    return best


def smooth_image(height: int, width: int) -> Image.Image:
    yy, xx = np.mgrid[0:height, 0:width]
    rgb = np.stack([128 + 100 * np.sin(xx / 13.0), 128 + 100 * np.cos(yy / 9.0), (xx + yy) % 256], -1)
    return Image.fromarray(rgb.astype(np.uint8))


@pytest.mark.parametrize("shape", [(300, 400), (401, 299), (224, 224)])
def test_the_processor_and_timms_transform_give_the_same_pixels(shape):
    """For every registered data config (converted entries' crop_pct and interpolation included): transformers'
    processor that a saved folder carries and timm's eval transform of the same folder agree to resize rounding
    (2 grey levels; its PIL backend exactly, up to the crop offset). Before: the processor squashed the whole image,
    3.99 apart (normalised) on a 300x400 image."""
    from transformers import BitImageProcessor
    from transformers.models.bit.image_processing_pil_bit import BitImageProcessorPil

    image = smooth_image(*shape)
    configs = registered_data_configs()
    assert {c.crop_pct for c in configs} >= {0.875, 0.9, 1.0} and len({c.interpolation for c in configs}) >= 2
    for dc in configs:
        timm_pixels = timm.data.create_transform(**timm.data.resolve_data_config(dc.timm_fields()))(image)
        for backend, tolerance in ((BitImageProcessor, 2.5), (BitImageProcessorPil, 0.01)):
            processed = backend(**dc.processor_kwargs())(image, return_tensors="pt")["pixel_values"][0]
            assert processed.shape == timm_pixels.shape, (dc, backend)
            grey_levels = best_shift_difference(processed, timm_pixels) * min(dc.std) * 255
            assert grey_levels < tolerance, (dc, backend.__name__, grey_levels)


def test_a_saved_folder_carries_its_crop_to_both_faces(tmp_path):
    """A converted source's crop (here 0.875, bilinear) written by save_checkpoint and by the transformers face's
    save_pretrained: both faces' preprocessing of the folder read it."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = timm.create_model("vit_t4_ape", embed_dim=32, depth=1, num_heads=2,
                              pretrained_cfg_overlay=dict(crop_pct=0.875, interpolation="bilinear"))
    folder = pape_hub.save_checkpoint(model, tmp_path / "a")
    again = tmp_path / "b"
    AutoModelForImageClassification.from_pretrained(folder).save_pretrained(again)
    for saved in (folder, again):
        processor = AutoImageProcessor.from_pretrained(saved)
        assert processor.size == {"shortest_edge": 36} and processor.crop_size == {"height": 32, "width": 32}
        assert processor.resample == 2
        cfg = timm.create_model(f"local-dir:{saved}").pretrained_cfg
        assert (cfg["crop_pct"], cfg["interpolation"]) == (0.875, "bilinear")


# --- 3 and 4: a revision, and a sharded folder, in both faces -----------------------------------------------------
def test_sharded_folders_load_in_both_faces_locally(tmp_path):
    from transformers import AutoModelForImageClassification

    from pape_hub.hf import PapeViTConfig, PapeViTForImageClassification

    torch.manual_seed(0)
    model = PapeViTForImageClassification(PapeViTConfig(**dict(SMALL, hidden_size=64, num_hidden_layers=2,
                                                                position_encoding="rope_mixed"))).eval()
    model.save_pretrained(tmp_path / "sharded", max_shard_size="60KB")
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(x).logits
        via_timm = timm.create_model(f"local-dir:{tmp_path / 'sharded'}", pretrained=True).eval()(x)
        loaded, _ = pape_hub.load_checkpoint(tmp_path / "sharded")
        via_hf = AutoModelForImageClassification.from_pretrained(tmp_path / "sharded")(x).logits
    assert torch.equal(via_timm, expected) and torch.equal(loaded.eval()(x), expected)
    assert torch.equal(via_hf, expected)


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_timm_loads_a_revision_and_a_sharded_repo_from_the_hub(tmp_path):
    from lab.local_hub import LocalHub
    from pape_hub.hf import PapeViTConfig, PapeViTForImageClassification

    server = LocalHub(tmp_path / "hub-data").start()
    try:
        torch.manual_seed(0)
        first = PapeViTForImageClassification(PapeViTConfig(**SMALL)).eval()
        second = PapeViTForImageClassification(PapeViTConfig(**SMALL)).eval()  # other weights
        first.save_pretrained(tmp_path / "v1", max_shard_size="20KB")
        pape_hub.save_checkpoint(second, tmp_path / "v2")
        script = f"""
            import json, torch, timm, pape_hub
            from huggingface_hub import HfApi
            api = HfApi()
            api.create_repo("org/revs", exist_ok=True)
            one = api.upload_folder(repo_id="org/revs", folder_path="{tmp_path / 'v1'}").oid
            api.upload_folder(repo_id="org/revs", folder_path="{tmp_path / 'v2'}")
            x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
            old = timm.create_model("hf-hub:org/revs@" + one, pretrained=True).eval()
            new = timm.create_model("hf-hub:org/revs", pretrained=True).eval()
            with torch.no_grad():
                print(json.dumps([old(x).tolist(), new(x).tolist()]))
        """
        env = {**os.environ, **server.client_env(), "HF_HOME": str(tmp_path / "hf_home")}
        env.pop("HF_HUB_OFFLINE", None)
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=600)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    old, new = (torch.tensor(v) for v in json.loads(done.stdout.strip().splitlines()[-1]))
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(old, first(x).logits)  # the sharded first revision, not the newest
        torch.testing.assert_close(new, second(x).logits)


# --- 5. split names -----------------------------------------------------------------------------------------------
def class_folders(root: Path, per_class: int) -> None:
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(root / c / f"{i}.png")


@pytest.mark.parametrize("name", ["validation", "val"])
def test_a_validation_folder_is_the_validation_split(tmp_path, name):
    from pape_hub.data import build_data

    class_folders(tmp_path / "train", 5)
    class_folders(tmp_path / name, 2)
    data = build_data(f"imagefolder:{tmp_path}", img_size=8)
    assert (len(data.train), len(data.val), data.test) == (10, 4, None)
    assert data.description["val_from"] == "its own validation split"
    class_folders(tmp_path / "test", 3)
    assert len(build_data(f"imagefolder:{tmp_path}", img_size=8).test) == 6


def test_split_test_without_a_test_folder_is_refused_and_the_default_says_validation(tmp_path, capsys):
    from pape_hub.evaluation import evaluate_checkpoint

    class_folders(tmp_path / "data", 6)
    model = timm.create_model("vit_t4_ape", embed_dim=32, depth=1, num_heads=2, num_classes=2, img_size=8,
                              patch_size=4)
    folder = pape_hub.save_checkpoint(model, tmp_path / "ckpt", label_names=["a", "b"])
    with pytest.raises(ValueError, match="has no test split .* --split validation"):
        evaluate_checkpoint(folder, f"imagefolder:{tmp_path / 'data'}", resolutions=[8], split="test",
                            progress=False)
    result = evaluate_checkpoint(folder, f"imagefolder:{tmp_path / 'data'}", resolutions=[8], progress=False)
    assert result.split == "validation" and "no test split" in capsys.readouterr().out
    from pape_hub.card import render_model_card

    card = render_model_card(json.loads((folder / "config.json").read_text()), result)
    assert "Validation split (the dataset has no test split" in str(card)
    assert "split: validation" in str(card)


def test_recorded_code_version_is_pape_hubs_not_the_users_project(tmp_path):
    """An installed package inside the user's own git project names its version, not the project's commit."""
    from pape_hub import records

    fake = tmp_path / "site-packages" / "pape_hub"
    fake.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    original = records.PACKAGE
    records.PACKAGE = fake
    try:
        assert records.git_commit().startswith(("pape_hub ", "unknown"))
    finally:
        records.PACKAGE = original


def test_the_local_hub_answers_an_id_without_namespace_as_not_found(tmp_path):
    """transformers' ``backbone="<timm name>"`` asks the Hub for an un-namespaced id; the real Hub answers that the
    repo does not exist (404 RepoNotFound), and so does the local endpoint (it answered "no route")."""
    import urllib.error
    import urllib.request

    from lab.local_hub import LocalHub

    server = LocalHub(tmp_path / "hub-data").start()
    try:
        for path in ("/api/models/vit_tiny_patch16_224", "/vit_tiny_patch16_224/resolve/main/config.json"):
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(server.url + path, timeout=30)
            assert caught.value.code == 404 and caught.value.headers.get("X-Error-Code") == "RepoNotFound", path
    finally:
        server.stop()
