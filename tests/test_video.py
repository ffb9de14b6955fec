"""Video: the encodings in 3-D (float64 properties), every registered ViViT, both input layouts, the transformers
face (Auto classes, video processor, remote code), the motion task and the video-folder loader, and a short
training run with a clip sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from helpers import free_positions, logits, make_encoding, random_coords, random_qkx, transform

import pape_hub
from pape_hub.checkpoint import load_checkpoint, save_checkpoint
from pape_hub.data import MotionConfig, MotionDataset, build_data
from pape_hub.data.arrows import STEPS
from pape_hub.data.video import VideoTransform, read_video
from pape_hub.encodings import grid_positions
from pape_hub.evaluation import evaluate_checkpoint
from pape_hub.training import TrainConfig, train

N = 12
GRID3 = (2, 3, 4)  # (T, H, W)
TINY_VIDEO = dict(embed_dim=32, depth=2, num_heads=2, img_size=32, num_frames=4, tubelet_size=(2, 8, 8))
VIDEO_MODELS = pape_hub.list_pape_models("vivit")

# encodings whose attention depends on relative (t, y, x) only
RELATIVE_3D = [("rope", {}), ("rope_mixed", {}), ("alibi", {}), ("pape", {"num_parabolas": 7}), ("pape_ri", {}),
               ("liere", {"block_size": 2})]


# --- the encodings in 3-D ------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "kwargs"), RELATIVE_3D, ids=[n for n, _ in RELATIVE_3D])
def test_translation_invariance_in_t_y_x(name, kwargs):
    enc = make_encoding(name, grid=GRID3, num_prefix=0, **kwargs)
    coords = random_coords(N, p=3)
    q, k, x = random_qkx(N)
    for shift in ([0.0, 0.0, 5.3], [2.1, -3.4, 0.0], [1.7, 4.2, -6.5]):
        for layer in range(enc.ctx.depth):
            before = logits(enc, free_positions(coords, 0), q, k, x, layer)
            after = logits(enc, free_positions(coords + torch.tensor(shift, dtype=torch.float64), 0), q, k, x, layer)
            torch.testing.assert_close(after, before, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["rope", "rope_mixed", "liere8", "pape", "alibi"])
def test_time_matters_in_3d(name):
    """Moving one token in time changes the logits: time is encoded, not dropped."""
    enc = make_encoding(name, grid=GRID3, num_prefix=0)
    coords = random_coords(N, p=3)
    q, k, x = random_qkx(N)
    moved = coords.clone()
    moved[0, 2] += 1.0
    assert (logits(enc, free_positions(moved, 0), q, k, x) - logits(enc, free_positions(coords, 0), q, k, x)
            ).abs().max() > 1e-6


@pytest.mark.parametrize("num_prefix", [0, 1])
@pytest.mark.parametrize("name", ["pape", "pape_ri"])
def test_fused_pape_equals_the_pairwise_formula_with_p3(name, num_prefix):
    kwargs = {"num_parabolas": 5} if name == "pape" else {}
    enc = make_encoding(name, grid=GRID3, num_prefix=num_prefix, **kwargs)
    pos = grid_positions(GRID3, num_prefix, dtype=torch.float64, axis_units=(0.7, 1.0, 1.0))
    q, k, x = random_qkx(num_prefix + pos.num_patches)
    state = enc.prepare(pos)
    for layer in range(enc.ctx.depth):
        qa, ka = transform(enc, layer, q, k, x, state)
        extra = 9 if name == "pape" else 6  # p(p + 1)/2 + p channels for p = 3 (PaPE-RI: 2p, no cross terms)
        assert qa.shape[-1] == q.shape[-1] + extra
        fused = (qa @ ka.transpose(-1, -2)).softmax(-1)
        pairwise = enc.pairwise_scores(layer, q, k, x, pos).softmax(-1)
        torch.testing.assert_close(fused, pairwise, rtol=1e-9, atol=1e-12)


def test_rope_mixed_3d_init_uses_orthogonal_directions():
    enc = make_encoding("rope_mixed", grid=GRID3, num_prefix=0)
    k = enc.ctx.head_dim // 6  # frequencies per direction
    freqs = enc.freqs.detach()  # (depth, heads, 3, hd/2)
    directions = torch.stack([freqs[..., g * k] for g in range(3)], dim=-1)  # first frequency of each group
    directions = directions / directions.norm(dim=-2, keepdim=True)
    eye = torch.eye(3, dtype=directions.dtype).expand_as(directions)
    torch.testing.assert_close(directions.transpose(-1, -2) @ directions, eye, rtol=1e-6, atol=1e-6)


def test_polar_rope_3d_depends_on_time_offset_only():
    enc = make_encoding("polar_rope", grid=GRID3, num_prefix=0)
    coords = random_coords(N, p=3)
    q, k, x = random_qkx(N)
    later = coords + torch.tensor([0.0, 0.0, 4.2], dtype=torch.float64)
    torch.testing.assert_close(logits(enc, free_positions(later, 0), q, k, x),
                               logits(enc, free_positions(coords, 0), q, k, x), rtol=1e-9, atol=1e-10)


def test_sincos_3d_layout_x_y_t_thirds():
    enc = make_encoding("sincos", grid=GRID3, num_prefix=0)
    pos = grid_positions(GRID3, 0, dtype=torch.float64)
    table = enc.prepare_table(pos)
    third = table.shape[-1] // 3
    same_t = pos.coords[:, 2] == 1
    t_part = table[same_t, 2 * third:]
    assert torch.allclose(t_part, t_part[0].expand_as(t_part))  # the t third is constant within a frame


def test_sape2_3d_bias_equals_a_literal_loop():
    """SaPE^2's video extension: per axis, gates and contextual positions along each line of the (t, y, x) grid,
    then the sum of the three L2 distances - written out with explicit loops here."""
    from pape_hub.encodings.sape2 import contextual_position_logits

    enc = make_encoding("sape2", grid=GRID3, num_prefix=0)
    T, H, W = GRID3
    q, k, x = random_qkx(T * H * W)
    bias = enc.attn_bias(0, q, k, enc.prepare(grid_positions(GRID3, 0)))
    scale = enc.ctx.head_dim ** -0.5
    index = torch.arange(T * H * W).reshape(T, H, W)
    expected = torch.zeros_like(bias)
    for coord_axis, grid_axis in ((0, 2), (1, 1), (2, 0)):  # x along W, y along H, t along T
        emb = enc.pos_emb[0, coord_axis].double()
        vectors = torch.zeros(q.shape[0], q.shape[1], T * H * W, GRID3[grid_axis], dtype=torch.float64)
        for line in index.movedim(grid_axis, -1).reshape(-1, GRID3[grid_axis]):
            vectors[:, :, line] = contextual_position_logits(q[:, :, line], k[:, :, line], emb, scale, True)
        expected = expected + torch.cdist(vectors, vectors)
    torch.testing.assert_close(bias, expected * scale, rtol=1e-9, atol=1e-10)


def test_ape_3d_table_resamples_over_time_and_space():
    model = timm.create_model("vivit_t16_ape", **TINY_VIDEO).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 8, 48, 40)).isfinite().all()  # 4 x 6 x 5 tubelets from a 2 x 4 x 4 table
    table = model.pos_encoding.pos_embed
    model.set_input_size(img_size=32, num_frames=8)
    assert model.pos_encoding.pos_embed.shape == (1, 1 + 4 * 4 * 4, 32) and table.shape == (1, 1 + 2 * 4 * 4, 32)


def test_lookhere_is_images_only_and_says_so():
    from pape_hub.models.vivit import VideoVisionTransformer

    with pytest.raises(ValueError, match="'lookhere' is defined for 2-D \\(images\\) inputs only"):
        VideoVisionTransformer(position_encoding="lookhere", **TINY_VIDEO)
    assert not any(name.endswith("_lookhere") for name in VIDEO_MODELS)


# --- the models ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in VIDEO_MODELS if n.startswith("vivit_t16_")])
def test_every_video_encoding_trains_and_runs_other_clips(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=5, **TINY_VIDEO)
    x = torch.randn(2, 3, 4, 32, 32)
    out = model(x)
    assert out.shape == (2, 5)
    out.logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not missing, f"parameters without gradient: {missing}"
    model.eval()
    with torch.no_grad():
        same = model(x)
        torch.testing.assert_close(model(x.transpose(1, 2)), same)  # the transformers layout (B, T, C, H, W)
        for clip in ((1, 3, 8, 32, 32), (1, 3, 2, 48, 40), (1, 3, 6, 24, 56)):  # frames and sizes it never saw
            assert model(torch.randn(clip)).isfinite().all()
        model.position_interpolation = True
        assert model(torch.randn(1, 3, 8, 48, 48)).isfinite().all()


def test_registered_video_sizes_on_meta_and_bad_input():
    with torch.device("meta"):
        model = timm.create_model("vivit_b16_pape")
    assert model.patch_embed.grid_size == (8, 14, 14) and model.embed_dim == 768 and model.num_classes == 400
    tiny = timm.create_model("vivit_t16_rope", **TINY_VIDEO).eval()
    with pytest.raises(ValueError, match="not whole tubelets of 2x8x8"):
        tiny(torch.randn(1, 3, 5, 32, 32))
    with pytest.raises(ValueError, match="expected 3 input channels"):
        tiny(torch.randn(1, 4, 4, 32, 32))
    with pytest.raises(ValueError, match="expected a video batch"):
        tiny(torch.randn(1, 3, 32, 32))
    fixed = timm.create_model("vivit_t16_rope", input_layout="BTCHW", **TINY_VIDEO).eval()
    clip = torch.randn(1, 3, 3, 32, 32)  # 3 frames of RGB: ambiguous, the fixed layout decides
    with torch.no_grad(), pytest.raises(ValueError, match="not whole tubelets"):
        fixed(clip)  # read as 3 frames (B, T, C, H, W): not a multiple of 2


def test_features_and_intermediates_are_ncthw():
    model = timm.create_model("vivit_t16_pape", **TINY_VIDEO).eval()
    with torch.no_grad():
        final, inter = model.forward_intermediates(torch.randn(2, 3, 4, 32, 32), indices=[0, 1])
    assert [t.shape for t in inter] == [(2, 32, 2, 4, 4)] * 2


# --- the transformers face ------------------------------------------------------------------------------
def test_transformers_video_face_round_trip_and_processor(tmp_path):
    from transformers import AutoConfig, AutoModel, AutoModelForVideoClassification, AutoVideoProcessor

    model = timm.create_model("vivit_t16_liere8", num_classes=3, **TINY_VIDEO).eval()
    folder = save_checkpoint(model, tmp_path / "ckpt", label_names=["a", "b", "c"],
                             data_config=dict(mean=[0.1] * 3, std=[0.2] * 3))
    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == "pape_vivit" and config.num_frames == 4 and list(config.tubelet_size) == [2, 8, 8]
    hf = AutoModelForVideoClassification.from_pretrained(folder).eval()
    backbone = AutoModel.from_pretrained(folder).eval()
    x = torch.randn(2, 4, 3, 32, 32)  # (B, T, C, H, W) as transformers' ViViT
    with torch.no_grad():
        assert torch.equal(hf(pixel_values=x).logits, model(x.transpose(1, 2)))
        assert backbone(pixel_values=x).pooler_output.shape == (2, 32)
        out = hf(pixel_values=x, output_hidden_states=True, output_attentions=True,
                 labels=torch.tensor([0, 2]))
    assert len(out.hidden_states) == 3 and out.attentions[0].shape == (2, 2, 33, 33) and out.loss is not None
    timm_again, _ = load_checkpoint(folder)
    with torch.no_grad():
        assert torch.equal(timm_again.eval()(x), model(x))
    processor = AutoVideoProcessor.from_pretrained(folder)
    video = [np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8) for _ in range(4)]
    pixels = processor(videos=[video], return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, 4, 3, 32, 32)
    expected = (torch.from_numpy(video[0]).permute(2, 0, 1).float() / 255)
    assert abs(float(pixels[0, 0].mean()) - float((expected.mean() - 0.1) / 0.2)) < 0.1  # the model's normalisation


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_video_folder_loads_with_remote_code_only(tmp_path):
    model = timm.create_model("vivit_t16_rope_mixed", num_classes=2, **TINY_VIDEO).eval()
    folder = save_checkpoint(model, tmp_path / "ckpt", label_names=["x", "y"])
    assert {"modeling_pape_vivit.py", "configuration_pape_vivit.py", "video_processing_pape_vivit.py",
            "pape_hub_core.py"} <= {p.name for p in folder.iterdir()}
    x = torch.randn(1, 4, 3, 32, 32)
    torch.save(x, tmp_path / "x.pt")
    with torch.no_grad():
        expected = model(x).tolist()
    script = f"""
import sys, json, torch
sys.modules['pape_hub'] = None  # importing pape_hub fails: only the folder's code may be used
from transformers import AutoModelForVideoClassification
model = AutoModelForVideoClassification.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
x = torch.load({str(tmp_path / "x.pt")!r})
with torch.no_grad():
    print(json.dumps(model(pixel_values=x).logits.tolist()))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    torch.testing.assert_close(torch.tensor(json.loads(done.stdout.strip().splitlines()[-1])),
                               torch.tensor(expected), rtol=0, atol=1e-6)


# --- data ----------------------------------------------------------------------------------------------
def test_motion_task_follows_its_rule():
    config = MotionConfig(frames=8, grid=6, distractors=2)  # the harder variant: squares that stand still
    ds = MotionDataset(200, config, seed=1)
    labels = []
    for i in range(len(ds)):
        clip, label, layout = ds.sample(i)
        path, still = layout["path"], layout["distractors"]
        assert len(path) == config.steps and all(0 <= r < 6 and 0 <= c < 6 for r, c in path)
        step = STEPS[label]
        assert all((b[0] - a[0], b[1] - a[1]) == step for a, b in zip(path, path[1:]))  # one cell per step
        assert not set(path) & set(still) and len(still) == 2
        for s in range(config.steps):
            frames = clip[s * 2:(s + 1) * 2]
            assert np.array_equal(frames[0], frames[1])  # still within a tubelet: no token shows motion
            r, c = path[s]
            assert frames[0][r * 8 + 4, c * 8 + 4] == 255  # the mover is where its path says
        labels.append(label)
    assert set(labels) == {0, 1, 2, 3}
    assert np.array_equal(ds.sample(7)[0], MotionDataset(200, config, seed=1).sample(7)[0])  # deterministic
    x, _ = ds[0]
    assert x.shape == (3, 8, 48, 48)


@pytest.mark.parametrize("kwargs,match", [(dict(frames=5), "multiple of"), (dict(frames=2), "at least 2 time"),
                                           (dict(frames=12, grid=5), "grid of at least 6")])
def test_motion_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MotionConfig(**kwargs)


def write_clip(path: Path, frames: int, size: int = 24, value: int = 0, fps: int = 8) -> None:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            frame = np.full((size, size, 3), value + 10 * i, dtype=np.uint8)  # brighter frame by frame
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def make_videofolder(root: Path, classes=("jump", "walk"), per_class: int = 4) -> Path:
    for split in ("train", "test"):
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(per_class):
                write_clip(root / split / name / f"{i}.mp4", frames=6 + i, value=100 * c)
    return root


def test_video_folder_loader_decodes_and_samples_frames(tmp_path):
    root = make_videofolder(tmp_path / "videos")
    clip = read_video(root / "train" / "walk" / "3.mp4", num_frames=4)
    assert clip.shape == (4, 24, 24, 3)
    assert clip[0].mean() < clip[-1].mean()  # frames sampled in order over the whole clip
    tf = VideoTransform(16, [0.5] * 3, [0.25] * 3)
    data = build_data(f"videofolder:{root}", img_size=16, num_frames=4, train_transform=tf, eval_transform=tf,
                      val_fraction=0.25)
    x, label = data.test[0]
    assert data.classes == ["jump", "walk"] and x.shape == (3, 4, 16, 16) and label == 0 and data.is_video
    (root / "train" / "walk" / "broken.mp4").write_bytes(b"not a video")
    with pytest.raises(ValueError, match="cannot decode video .*broken.mp4"):
        read_video(root / "train" / "walk" / "broken.mp4", 4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_data(f"videofolder:{tmp_path / 'none'}", img_size=16)


# --- training and evaluation ------------------------------------------------------------------------
VIDEO_KWARGS = dict(embed_dim=32, depth=2, num_heads=2, tubelet_size=[2, 8, 8], global_pool="avg", class_token=False)


def test_short_training_run_on_the_motion_task_and_clip_sweep(tmp_path):
    cfg = TrainConfig(model="vivit_t16_rope", model_kwargs=VIDEO_KWARGS, dataset="motion", epochs=2, batch_size=32,
                      train_size=128, eval_size=64, output_dir=str(tmp_path / "run"), quiet=True, label_smoothing=0,
                      drop_path=0)
    results = train(cfg)
    assert 0 <= results["test"]["top1"] <= 1 and results["test"]["count"] == 64
    sweep = evaluate_checkpoint(tmp_path / "run" / "best", "motion", clips=["6x5", "6x7", "10x5"], eval_size=64)
    sizes = {(r.size, r.interpolation, r.patch_shuffle) for r in sweep.rows}
    assert sizes == {("6x5", False, False), ("6x5", False, True), ("6x7", False, False), ("6x7", True, False),
                     ("10x5", False, False), ("10x5", True, False)}
    assert sweep.accuracy("6x5") == results["test"]["top1"] and sweep.trained_at == "6x5"


def test_training_on_a_video_folder_and_mismatched_data(tmp_path):
    root = make_videofolder(tmp_path / "videos")
    cfg = TrainConfig(model="vivit_t16_pape", model_kwargs=VIDEO_KWARGS, dataset=f"videofolder:{root}",
                      img_size=16, num_frames=4, epochs=1, batch_size=2, output_dir=str(tmp_path / "run"),
                      quiet=True, aug="light", val_fraction=0.25)
    results = train(cfg)
    assert results["test"]["count"] == 8
    sweep = evaluate_checkpoint(tmp_path / "run" / "best", f"videofolder:{root}", clips=["4x16", "8x24"])
    assert set(sweep.sizes()) == {"4x16", "8x24"}
    with pytest.raises(ValueError, match="is a video model but 'digits' is an image dataset"):
        train(TrainConfig(model="vivit_t16_pape", model_kwargs=VIDEO_KWARGS, dataset="digits",
                          output_dir=str(tmp_path / "bad")))
