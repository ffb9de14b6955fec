"""Native-resolution training (``pape-hub train --native-resolution``) on timm's NaFlex loader machinery, the arrow
task at other aspect ratios (``--arrow-columns``, ``--arrow-shapes``) and the eval sweep over them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import pape_hub  # noqa: F401  (registers the models)
from pape_hub.data import ArrowConfig
from pape_hub.data.arrows import STEPS, ArrowDataset
from pape_hub.training import TrainConfig
from pape_hub.training.data import prepare_data
from pape_hub_cli import main

TINY = '{"embed_dim": 32, "depth": 1, "num_heads": 2}'


def test_one_arrow_shape_draws_what_the_square_grid_draws():
    """A single shape draws nothing extra from the generator: ``--arrow-shapes 4x4`` and ``--arrow-columns 4`` are
    the default task, sample for sample (the committed results stay reproducible)."""
    default = ArrowDataset(8, ArrowConfig(), seed=3)
    for other in (ArrowConfig(shapes="4x4"), ArrowConfig(columns=4)):
        same = ArrowDataset(8, other, seed=3)
        assert all(np.array_equal(default.sample(i)[0], same.sample(i)[0]) for i in range(8))


def test_a_shape_mix_draws_each_shape_with_the_target_beside_the_y():
    data = ArrowDataset(64, ArrowConfig(shapes="3x6,6x3,2x8"), seed=0)
    seen = set()
    for i in range(64):
        image, label, layout = data.sample(i)
        rows, cols = image.shape[0] // 12, image.shape[1] // 12
        seen.add((rows, cols))
        (y_row, y_col), y_glyph = next((cell, g) for cell, g in layout.items() if g.startswith("y"))
        step = STEPS[int(y_glyph[1])]
        target = (y_row + step[0], y_col + step[1])
        assert 0 <= target[0] < rows and 0 <= target[1] < cols and layout[target] == f"arrow{label}"
        assert all(r < rows and c < cols for r, c in layout)
    assert seen == {(3, 6), (6, 3), (2, 8)}


def test_native_batches_give_each_image_its_own_logits():
    """A validation batch of the shape mix, padded to the longest image, gives every image the logits it has alone
    as a plain (1, C, H, W) input: the loader's coordinates are the model's grid."""
    cfg = TrainConfig(model="vit_m12_rope_mixed", dataset="arrows", native_resolution=True, batch_size=8,
                      eval_size=8, train_size=8, arrow=dict(shapes="3x6,4x4,2x8"))
    data = prepare_data(cfg)
    torch.manual_seed(0)
    model = timm.create_model("vit_m12_rope_mixed", num_classes=4).eval()
    for p in model.parameters():  # away from init, so that positions matter
        p.data.normal_(0, 0.2)
    inputs, _ = next(iter(data.val_loader))
    assert not inputs["patch_valid"].all()  # padded: the shapes differ in token count
    with torch.no_grad():
        batched = model(inputs)
        alone = torch.cat([model(data.data.val[i][0][None]) for i in range(len(batched))])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


def test_train_on_arrow_shapes_then_eval_at_other_aspect_ratios(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--model", "vit_m12_pape", "--model-kwargs", TINY, "--dataset", "arrows",
                 "--native-resolution", "--arrow-shapes", "3x5,5x3,4x4", "--epochs", "1", "--train-size", "32",
                 "--eval-size", "16", "--batch-size", "16", "--output-dir", str(out), "--quiet"]) == 0
    config = json.loads((out / "best" / "config.json").read_text())
    assert config["pape_hub"]["recipe"]["native_resolution"] is True
    assert main(["eval", str(out), "--sizes", "4,2x8,8x4", "--eval-size", "16", "--interpolation", "off",
                 "--patch-shuffle", "none"]) == 0
    rows = json.loads((out / "best" / "eval.json").read_text())["rows"]
    assert [r["size"] for r in rows] == [4, "2x8", "8x4"]


def write_folder(root, shapes):
    rng = np.random.default_rng(0)
    for split, count in (("train", 6), ("validation", 3)):
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True)
            for i in range(count):
                h, w = shapes[i % len(shapes)]
                pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / cls / f"{i}.png")


def test_an_image_folder_trains_at_native_aspect_ratio_with_mixup(tmp_path):
    """Files go through timm's NaFlex transforms: each image resized to the sequence length with its aspect ratio
    kept, and the default preset's Mixup/CutMix applied by timm's NaFlexMixup (soft targets)."""
    write_folder(tmp_path / "data", [(40, 80), (64, 32)])
    cfg = TrainConfig(model="vit_t4_rope_mixed", model_kwargs={"img_size": 32, "embed_dim": 32, "depth": 1,
                                                                "num_heads": 2},
                      dataset=f"imagefolder:{tmp_path / 'data'}", native_resolution=True, seq_lens=(32, 64),
                      batch_size=4, output_dir=str(tmp_path / "run"), epochs=1, quiet=True)
    data = prepare_data(cfg)
    inputs, labels = next(iter(data.val_loader))
    for coord, valid in zip(inputs["patch_coord"], inputs["patch_valid"]):
        rows, cols = (coord[valid].max(0).values + 1).tolist()
        assert rows * cols == int(valid.sum()) and rows != cols  # a 1:2 or 2:1 grid, not a square
    _, soft = next(iter(data.train_loader))
    assert soft.shape[-1] == 2 and soft.dtype.is_floating_point  # Mixup's soft targets
    from pape_hub.training import train

    assert train(cfg)["best_epoch"] == 0


@pytest.mark.parametrize("args,message", [
    (["--arrow-shapes", "3x5,5x3"], "add --native-resolution"),
    (["--seq-lens", "16"], "add --native-resolution"),
    (["--native-resolution", "--arrow-shapes", "3x6,6x3", "--seq-lens", "16"], "pass at least 18"),
    (["--native-resolution", "--arrow-shapes", "3x6,1x4"], "at least 2 cells per side"),
    (["--native-resolution", "--dataset", "motion", "--model", "vivit_t16_rope"], "is video"),
])
def test_what_native_resolution_cannot_do_is_refused_by_name(tmp_path, capsys, args, message):
    base = ["train", "--model", "vit_m12_pape", "--dataset", "arrows", "--epochs", "1", "--output-dir",
            str(tmp_path / "x"), "--quiet"]
    assert main(base + args) == 1
    assert message in capsys.readouterr().err


def test_the_lab_compares_native_with_fixed_size_training_at_other_aspect_ratios():
    """``python -m lab arrows --native`` trains the shape mix at native resolution into its own folders and sweeps
    the aspect grids; ``--aspect`` scores the main job's setting there (with --resume, its checkpoints)."""
    import argparse

    from lab.commands import arrows

    parser = argparse.ArgumentParser()
    arrows.add_arguments(parser)
    name, setting, preset, results, output = arrows.run_setting(parser.parse_args(["--native"]))
    assert (name, setting["shapes"], preset["native_resolution"]) == ("native", arrows.NATIVE_SHAPES, True)
    assert (results.name, output.name) == ("arrows_native", "arrows_native")
    name, setting, preset, results, _ = arrows.run_setting(parser.parse_args(["--aspect"]))
    assert (name, preset["native_resolution"], results.name) == ("default", False, "arrows_aspect")
    assert "shapes" not in setting


def test_the_padding_bench_times_every_form_against_the_square_batch(tmp_path):
    import argparse

    from lab.commands import padding

    parser = argparse.ArgumentParser()
    padding.add_arguments(parser)
    out = tmp_path / "padding.json"
    args = parser.parse_args(["--size", "t", "--resolution", "64", "--encodings", "ape,rope_mixed", "--repeats", "1",
                              "--warmup", "0", "--output", str(out)])
    assert padding.run(args) == 0
    data = json.loads(out.read_text())
    assert set(data["rows"]) == {"timm_naflexvit", "ape", "rope_mixed"}
    assert data["valid_tokens"]["square"] == data["valid_tokens"]["naflex_square"] == 8 * 16
    assert data["valid_tokens"]["padded"] < 8 * data["padded_length"]  # other aspect ratios leave padding
    from lab.commands.report import padding_block

    (tmp_path / "results").mkdir()
    out.rename(tmp_path / "results" / "p.json")
    assert "| `rope_mixed` |" in padding_block(tmp_path / "results", "p.json")
