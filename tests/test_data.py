"""The arrow generator and the real-dataset loaders, on small data the tests make in the real formats."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from pape_hub.data import (
    ArrowConfig,
    ArrowDataset,
    arrow_statistics,
    build_data,
    channel_statistics,
    describe_spec,
    paper_setting,
    stratified_split,
)
from pape_hub.data.arrows import STEPS, render_glyphs


def test_arrow_generator_is_deterministic():
    a, b = ArrowDataset(10, seed=3), ArrowDataset(10, seed=3)
    for i in range(10):
        assert np.array_equal(a.sample(i)[0], b.sample(i)[0])
    assert not np.array_equal(ArrowDataset(10, seed=4).sample(0)[0], a.sample(0)[0])


@pytest.mark.parametrize("config", [ArrowConfig(), ArrowConfig(grid=6, num_letters=3, hard_negatives=2, num_arrows=8),
                                    paper_setting()])
def test_arrow_labels_follow_the_rule(config):
    ds = ArrowDataset(200, config, seed=1)
    glyphs = render_glyphs(config.cell)
    labels = []
    for i in range(len(ds)):
        image, label, layout = ds.sample(i)
        (y_cell, y_glyph), = [(c, g) for c, g in layout.items() if g.startswith("y")]
        stem = int(y_glyph[1])
        target = (y_cell[0] + STEPS[stem][0], y_cell[1] + STEPS[stem][1])
        assert layout[target] == f"arrow{label}"  # the arrow next to the Y's stem gives the label
        r, c = target
        cell = image[r * config.cell:(r + 1) * config.cell, c * config.cell:(c + 1) * config.cell]
        assert np.array_equal(cell, glyphs[f"arrow{label}"])  # and it is drawn there
        directions = Counter(g for g in layout.values() if g.startswith("arrow"))
        assert set(directions.values()) == {config.num_arrows // 4} and len(directions) == 4  # balanced
        neighbours = [(y_cell[0] + dr, y_cell[1] + dc) for dr, dc in STEPS.values()]
        hard = [n for n in neighbours if n != target and layout.get(n, "").startswith("arrow")]
        assert len(hard) >= min(config.hard_negatives, sum(
            0 <= n[0] < config.grid and 0 <= n[1] < config.grid for n in neighbours) - 1)
        assert sum(g in "ABCDE" for g in layout.values()) == config.num_letters
        labels.append(label)
    assert set(labels) == {0, 1, 2, 3}


def test_arrow_glyph_orientations():
    glyphs = render_glyphs(12)
    up = glyphs["arrow0"]
    assert up[:4].sum() > up[-4:].sum()  # the head is at the top
    assert np.array_equal(glyphs["arrow1"], np.rot90(up, -1))
    y_up = glyphs["y0"]  # stem pointing up: the arms are at the bottom
    assert y_up[-4:, :4].sum() > 0 and y_up[:4, :4].sum() == 0


def test_arrow_dataset_tensor_is_normalised_with_the_task_statistics():
    mean, std = arrow_statistics(ArrowConfig())
    assert 0.03 < mean < 0.06 and 0.15 < std < 0.2  # mostly black background, thin white glyphs
    raw, _ = ArrowDataset(2, normalize=None)[0]
    x, y = ArrowDataset(2)[0]
    assert x.shape == (3, 48, 48) and y in range(4) and raw.min() == 0 and raw.max() == 1
    torch.testing.assert_close(x, (raw - mean) / std)
    # a checkpoint's per-channel values, and a grey model
    given = ArrowDataset(2, normalize=([0.1, 0.2, 0.3], [0.5, 0.5, 0.5]))[0][0]
    torch.testing.assert_close(given[:, 0, 0], torch.tensor([-0.2, -0.4, -0.6]))
    assert ArrowDataset(2, channels=1)[0][0].shape == (1, 48, 48)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_arrows=6), "multiple of 4"), (dict(grid=2, num_arrows=4), "do not fit"),
    (dict(cell=4), "at least 8"), (dict(hard_negatives=4, num_arrows=8), "hard_negatives"),
])
def test_arrow_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArrowConfig(**kwargs)


def test_stratified_split_keeps_class_proportions():
    labels = [0] * 50 + [1] * 30 + [2] * 20
    train, val = stratified_split(labels, 0.1, seed=0)
    assert not set(train) & set(val) and len(train) + len(val) == 100
    assert Counter(labels[i] for i in val) == {0: 5, 1: 3, 2: 2}


def make_imagefolder(root, classes=("cat", "dog"), per_class=6, size=20):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{i}.png")
    return root


def test_imagefolder_loader(tmp_path):
    make_imagefolder(tmp_path)
    data = build_data(f"imagefolder:{tmp_path}", img_size=16, val_fraction=0.2)
    assert data.classes == ["cat", "dog"] and data.natural_images
    assert len(data.train) + len(data.val) == 12 and len(data.test) == 12
    image, label = data.val[0]
    assert image.size == (20, 20) and label in (0, 1)  # no transform given: PIL images


def test_cifar_pickle_loader(tmp_path):
    rng = np.random.default_rng(0)
    for name, n in [("data_batch_1", 20), ("data_batch_2", 20), ("test_batch", 10)]:
        batch = {b"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8), b"labels": list(rng.integers(0, 10, n))}
        (tmp_path / name).write_bytes(pickle.dumps(batch))
    (tmp_path / "batches.meta").write_bytes(pickle.dumps({b"label_names": [f"c{i}".encode() for i in range(10)]}))
    data = build_data(f"cifar:{tmp_path}", img_size=32, val_fraction=0.2)
    assert len(data.classes) == 10 and len(data.test) == 10 and len(data.train) + len(data.val) == 40
    assert data.test[0][0].size == (32, 32)


def test_hf_datasets_loader_and_column_errors(tmp_path):
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)) for _ in range(12)]
    features = datasets.Features({"img": datasets.Image(), "fine": datasets.ClassLabel(names=["a", "b", "c"])})
    ds = datasets.Dataset.from_dict({"img": images, "fine": [i % 3 for i in range(12)]}, features=features)
    datasets.DatasetDict(train=ds, test=ds.select(range(6))).save_to_disk(str(tmp_path / "hfdata"))
    data = build_data(f"hf:{tmp_path / 'hfdata'}", img_size=8, image_column="img", label_column="fine")
    assert data.classes == ["a", "b", "c"] and len(data.test) == 6
    with pytest.raises(ValueError, match="no column 'label'.*--label-column"):
        build_data(f"hf:{tmp_path / 'hfdata'}", img_size=8, image_column="img")


@pytest.mark.parametrize("raw_labels", [["cat", "dog", "emu"], [3, 5, 9]])
def test_hf_datasets_with_string_or_offset_labels_are_mapped(tmp_path, raw_labels):
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)) for _ in range(12)]
    labels = [raw_labels[i % 3] for i in range(12)]
    value = datasets.Value("string" if isinstance(labels[0], str) else "int64")
    ds = datasets.Dataset.from_dict({"image": images, "label": labels},
                                    features=datasets.Features({"image": datasets.Image(), "label": value}))
    datasets.DatasetDict(train=ds, test=ds.select([0, 4, 8])).save_to_disk(str(tmp_path / "hf"))
    data = build_data(f"hf:{tmp_path / 'hf'}", img_size=8, val_fraction=0.25)
    assert data.classes == [str(v) for v in raw_labels]
    every = [data.train[i][1] for i in range(len(data.train))] + [data.test[i][1] for i in range(len(data.test))]
    assert set(every) == {0, 1, 2}
    assert data.test[1][1] == 1  # raw label raw_labels[1] -> index 1, the same mapping for every split


def test_digits_from_scikit_learn_and_grey_images():
    data = build_data("digits", img_size=16)
    assert data.classes == [str(d) for d in range(10)] and len(data.test) == 599
    assert len(data.train) + len(data.val) == 1797 - 599
    image, label = data.train[0]
    assert image.mode == "RGB" and image.size == (8, 8) and label in range(10)
    grey = build_data("digits", img_size=16, channels=1)
    assert grey.train[0][0].mode == "L"


def test_channel_statistics_and_spec_description(tmp_path):
    class Constant(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.stack([torch.full((2, 2), 0.25), torch.tensor([[0.0, 1.0], [0.0, 1.0]])]), 0

    mean, std = channel_statistics(Constant())
    assert mean == [0.25, 0.5] and std[1] == 0.5 and std[0] == 0.001  # a flat channel's std is floored
    assert describe_spec(f"imagefolder:{tmp_path}/pets/") == "imagefolder:pets"  # no absolute paths recorded
    assert describe_spec("digits") == "digits" and describe_spec("hf:cifar10") == "hf:cifar10"


def test_missing_data_folders_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_data(f"imagefolder:{tmp_path / 'nope'}", img_size=16)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_data(f"cifar:{tmp_path / 'nope'}", img_size=32)
    with pytest.raises(ValueError, match="unknown dataset spec"):
        build_data("mnist", img_size=28)
    with pytest.raises(ValueError, match="renders 48px images"):
        build_data("arrows", img_size=32)


def test_generated_tasks_answer_what_callers_ask():
    from pape_hub.data import GENERATED_TASKS, MotionConfig, generated_task

    arrows, motion = generated_task("arrows"), generated_task("motion")
    assert generated_task("digits") is None and set(GENERATED_TASKS) == {"arrows", "motion"}
    assert (arrows.is_video, motion.is_video) == (False, True)
    recorded = dict(grid=5, cell=12, num_arrows=8, name="arrows", length=10)  # a checkpoint's record
    base = arrows.setting(recorded)
    assert (base.grid, base.num_arrows) == (5, 8)
    assert [arrows.size_of(s) for s in arrows.sweep(base, [4, 6])] == [4, 6]
    assert [motion.size_of(s) for s in motion.sweep(MotionConfig(), [(6, 7), (10, 5)])] == ["6x7", "10x5"]
    # by default, the sizes the task is compared at (the main job's grids; the motion comparison's clips)
    assert [arrows.size_of(s) for s in arrows.sweep(base, None)] == [5, 7, 9]
    assert [motion.size_of(s) for s in motion.sweep(MotionConfig(), None)] == ["6x5", "6x7", "10x5"]
    x, label = motion.dataset(2, MotionConfig(), seed=0, normalize=None, channels=1)[0]
    assert x.shape == (1, 6, 40, 40) and 0 <= label < 4
