"""The point-cloud and event data: generated tasks drawn from seeds, and readers of the real formats (ModelNet40's
``.off`` meshes and ``.txt`` samples; events in ``.npy`` / ``.npz`` / ``.h5``) tested on files written in them."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from pape_hub.data.event_streams import EventConfig, MovingDotDataset, load_event_folder, read_events
from pape_hub.data.point_clouds import SHAPES, ShapeConfig, ShapeDataset, load_modelnet, pad_collate, read_off


def test_shapes_are_drawn_from_seeds_and_normalised():
    data = ShapeDataset(12, ShapeConfig(points=200, min_points=50))
    a, b = data[3], ShapeDataset(12, ShapeConfig(points=200, min_points=50))[3]
    torch.testing.assert_close(a[0], b[0])
    sizes = {len(data[i][0]) for i in range(12)}
    assert min(sizes) >= 50 and max(sizes) <= 200 and len(sizes) > 1
    radius = a[0].norm(dim=-1).max()
    assert float(radius) == pytest.approx(1.0, abs=1e-5) and a[0].mean(0).abs().max() < 1e-5
    assert {data[i][1] for i in range(12)} <= set(range(len(SHAPES)))


def test_rotated_shapes_keep_their_distances():
    canonical = ShapeDataset(4, ShapeConfig(points=100, min_points=100))[0][0]
    rotated = ShapeDataset(4, ShapeConfig(points=100, min_points=100, rotate=True))[0][0]
    distances = lambda p: (p[:, None] - p[None]).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(distances(rotated), distances(canonical), atol=1e-5, rtol=1e-5)
    assert (rotated - canonical).abs().max() > 0.1


def test_the_moving_dot_differs_between_classes_only_in_time():
    """Right and left fire the same pixels with polarity that says nothing: reversing one stream's time gives the
    other's pixels in the other's order."""
    data = MovingDotDataset(40, EventConfig(noise=0))
    by_class = {}
    for i in range(40):
        events, label = data[i]
        by_class.setdefault(label, events)
    right, left = by_class[0], by_class[1]
    assert right.shape[1] == 4 and set(right[:, 3].tolist()) <= {-1.0, 1.0}
    first, last = right[right[:, 2].argmin()], right[right[:, 2].argmax()]
    assert first[0] < last[0]  # right: early events on the left
    first, last = left[left[:, 2].argmin()], left[left[:, 2].argmax()]
    assert first[0] > last[0]


def test_a_slower_dot_takes_longer():
    fast = MovingDotDataset(1, EventConfig(noise=0, speed=2.0))[0][0]
    slow = MovingDotDataset(1, EventConfig(noise=0, speed=0.5))[0][0]
    span = lambda e: float(e[:, 2].max() - e[:, 2].min())  # noqa: E731
    assert span(slow) == pytest.approx(4 * span(fast), rel=0.1)


def write_off(path, vertices, faces, joined=False):
    head = f"OFF{len(vertices)} {len(faces)} 0" if joined else f"OFF\n{len(vertices)} {len(faces)} 0"
    rows = [" ".join(map(str, v)) for v in vertices] + [f"{len(f)} " + " ".join(map(str, f)) for f in faces]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + "\n" + "\n".join(rows) + "\n")


CUBE_V = [(x, y, z) for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]
CUBE_F = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (0, 2, 6, 4), (1, 5, 7, 3)]


@pytest.mark.parametrize("joined", [False, True])
def test_off_meshes_are_read_and_quads_become_triangles(tmp_path, joined):
    write_off(tmp_path / "cube.off", CUBE_V, CUBE_F, joined)
    vertices, faces = read_off(tmp_path / "cube.off")
    assert vertices.shape == (8, 3) and faces.shape == (12, 3)


def test_a_broken_off_file_is_named(tmp_path):
    (tmp_path / "bad.off").write_text("OFF\n8 6 0\n1 2 3\n")
    with pytest.raises(ValueError, match="bad.off is a truncated"):
        read_off(tmp_path / "bad.off")


def test_modelnet_mesh_layout(tmp_path):
    for cls in ("chair", "table"):
        for split in ("train", "test"):
            write_off(tmp_path / cls / split / f"{cls}_0001.off", CUBE_V, CUBE_F)
    train, test = load_modelnet(tmp_path, num_points=64)
    assert train.classes == ["chair", "table"] and len(train) == len(test) == 2
    points, label = train[1]
    assert points.shape == (64, 3) and label == 1
    assert points.abs().max() <= 1.0 + 1e-6  # on the cube's faces, scaled into the unit sphere
    torch.testing.assert_close(train[0][0], train[0][0])  # the same points every epoch


def test_modelnet_resampled_txt_layout_with_normals(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("night_stand_0001", "night_stand_0002", "bed_0001"):
        cls = name.rsplit("_", 1)[0]
        (tmp_path / cls).mkdir(exist_ok=True)
        np.savetxt(tmp_path / cls / f"{name}.txt", rng.normal(size=(50, 6)), delimiter=",", fmt="%.6f")
    (tmp_path / "modelnet40_train.txt").write_text("night_stand_0001\nbed_0001\n")
    (tmp_path / "modelnet40_test.txt").write_text("night_stand_0002\n")
    train, test = load_modelnet(tmp_path, num_points=32, channels=6)
    assert train.classes == ["bed", "night_stand"] and [train.labels, test.labels] == [[1, 0], [1]]
    assert train[0][0].shape == (32, 6)


def write_events(path, events, kind):
    path.parent.mkdir(parents=True, exist_ok=True)
    x, y, t, p = events.T
    if kind == "npy-structured":
        array = np.zeros(len(events), dtype=[("t", "<i8"), ("x", "<u2"), ("y", "<u2"), ("p", "u1")])
        array["x"], array["y"], array["t"], array["p"] = x, y, t, p > 0
        np.save(path.with_suffix(".npy"), array)
    elif kind == "npy-columns":
        np.save(path.with_suffix(".npy"), events)
    elif kind == "npz":
        np.savez(path.with_suffix(".npz"), x=x, y=y, t=t, p=(p > 0).astype(np.uint8))
    else:
        with h5py.File(path.with_suffix(".h5"), "w") as f:
            group = f.create_group("events")
            for k, v in zip("xytp", (x, y, t, (p > 0).astype(np.uint8))):
                group.create_dataset(k, data=v)


@pytest.mark.parametrize("kind", ["npy-structured", "npy-columns", "npz", "h5"])
def test_event_files_are_read_in_every_layout(tmp_path, kind):
    events = MovingDotDataset(1)[0][0].double().numpy()
    events[:, 2] = np.round(events[:, 2])  # whole microseconds, as the integer layouts store them
    write_events(tmp_path / "stream", events, kind)
    read = read_events(next(tmp_path.iterdir()))
    np.testing.assert_allclose(read, events)


def test_event_folders_with_splits(tmp_path):
    data = MovingDotDataset(8)
    for i in range(8):
        events, label = data.sample(i)
        split = "test" if i >= 6 else "train"
        write_events(tmp_path / split / data.classes[label] / f"s{i}", events, "npz")
    for cls in data.classes:  # every class in both splits
        for split in ("train", "test"):
            write_events(tmp_path / split / cls / "extra", data.sample(0)[0], "npz")
    train, val, test = load_event_folder(tmp_path)
    assert val is None and train.classes == sorted(data.classes) and len(test) >= 4
    batch, labels = pad_collate([train[0], train[1]])
    assert batch["x"].shape[-1] == 4 and batch["valid"].sum() == len(train[0][0]) + len(train[1][0])


def test_event_files_without_fields_are_named(tmp_path):
    np.savez(tmp_path / "s.npz", x=[1], y=[2], t=[3])
    with pytest.raises(ValueError, match=r"s.npz has no event field\(s\) \['p'\]"):
        read_events(tmp_path / "s.npz")
