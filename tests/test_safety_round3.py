"""Reliability, round 3: each attack of the issue, reproduced, now holding. The High first: a forged manifest never
deletes a file outside the folder (absolute path, ``..``, a link, a Windows path); then push sends exactly the
checkpoint's own files, no validation means no "best" epoch, a changed dataset refuses a resume, and the Low ones."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from pape_hub.checkpoint import MANIFEST, load_checkpoint, save_checkpoint
from pape_hub.folder import is_plain_name

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(embed_dim=32, depth=1, num_heads=2)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return timm.create_model("vit_t4_ape", num_classes=3, **TINY)


# --- High: a forged manifest ---------------------------------------------------------------------------------------
def forged_folder(root: Path, entry: str, tiny: torch.nn.Module) -> tuple[Path, Path]:
    """A checkpoint folder as ``snapshot_download(local_dir=...)`` leaves a Hub repo carrying a forged manifest (its
    ``.cache/`` makes the folder foreign, so the save asks for ``overwrite=True``), and the victim file beside it."""
    victim = root / "thesis.txt"
    victim.write_text("four years of work")
    folder = root / "downloaded"
    save_checkpoint(tiny, folder)
    (folder / ".cache").mkdir()
    record = json.loads((folder / MANIFEST).read_text())
    record["files"].append(entry)
    (folder / MANIFEST).write_text(json.dumps(record))
    return folder, victim


@pytest.mark.parametrize("entry", ["ABS", "../thesis.txt", "..\\thesis.txt", "C:\\thesis.txt", "sub/../../thesis.txt"])
def test_a_forged_manifest_entry_is_refused_and_deletes_nothing(tmp_path, tiny, entry):
    folder, victim = forged_folder(tmp_path, str(tmp_path / "thesis.txt") if entry == "ABS" else entry, tiny)
    with pytest.raises(ValueError, match=r"not a plain file name inside .*Delete \.pape_hub_checkpoint\.json"):
        save_checkpoint(tiny, folder, overwrite=True)
    assert victim.read_text() == "four years of work"
    assert (folder / "model.safetensors").exists()  # the folder is as it was


def test_a_manifest_listing_a_link_removes_the_link_at_most_never_its_target(tmp_path, tiny):
    """A plain name that is a link in the folder (pointing at the user's file) is not pape_hub's: kept, target too."""
    victim = tmp_path / "thesis.txt"
    victim.write_text("four years of work")
    folder = tmp_path / "ckpt"
    save_checkpoint(tiny, folder)
    (folder / "notes.txt").symlink_to(victim)
    record = json.loads((folder / MANIFEST).read_text())
    record["files"].append("notes.txt")
    (folder / MANIFEST).write_text(json.dumps(record))
    save_checkpoint(tiny, folder, overwrite=True)  # the link is foreign (not a regular file): kept, not followed
    assert victim.read_text() == "four years of work" and (folder / "notes.txt").is_symlink()


def test_a_manifest_that_is_itself_a_link_is_refused(tmp_path, tiny):
    folder = tmp_path / "ckpt"
    save_checkpoint(tiny, folder)
    elsewhere = tmp_path / "m.json"
    elsewhere.write_text((folder / MANIFEST).read_text())
    (folder / MANIFEST).unlink()
    (folder / MANIFEST).symlink_to(elsewhere)
    (folder / "x.txt").write_text("user")
    with pytest.raises(ValueError, match="is a link"):
        save_checkpoint(tiny, folder, overwrite=True)


def test_plain_names():
    assert all(is_plain_name(n) for n in ["model.safetensors", ".pape_hub_checkpoint.json", "a b.py"])
    assert not any(is_plain_name(n) for n in ["", ".", "..", "a/b", "a\\b", "C:x", "/etc/passwd", "a\nb", 3, None])


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_the_convert_command_with_overwrite_refuses_it_too(tmp_path, tiny):
    folder, victim = forged_folder(tmp_path, "../thesis.txt", tiny)
    done = subprocess.run([sys.executable, "-m", "pape_hub_cli", "convert", "vit_s16_ape.fb_deit3_in1k", str(folder),
                           "--overwrite"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert done.returncode == 1 and "not a plain file name" in done.stderr, done.stderr
    assert victim.exists()


# --- Medium: push sends exactly the checkpoint's files -------------------------------------------------------------
def test_push_sends_the_manifests_files_and_what_include_names_only(tmp_path, tiny):
    from pape_hub.hub import files_to_push

    outside = tmp_path / "private.png"
    outside.write_bytes(b"\x89PNG private")
    folder = tmp_path / "ckpt"
    save_checkpoint(tiny, folder)
    own = files_to_push(folder)
    for stray in ["my_keys.py", ".secret_config.py", "wandb/run-1/files/code/train.py", "data/private/scan_0001.png",
                  "plots/curve.png"]:
        (folder / stray).parent.mkdir(parents=True, exist_ok=True)
        (folder / stray).write_text("not for the Hub")
    (folder / "plots" / "loss.png").symlink_to(outside)
    assert files_to_push(folder) == own  # none of them
    assert "model.safetensors" in own and "config.json" in own and MANIFEST not in own
    assert files_to_push(folder, ["plots/curve.png"]) == sorted([*own, "plots/curve.png"])
    with pytest.raises(ValueError, match="link or lies outside"):
        files_to_push(folder, ["plots/*.png"])
    with pytest.raises(FileNotFoundError, match="matches no file"):
        files_to_push(folder, ["nothing*.png"])
    with pytest.raises(ValueError, match="link or lies outside"):
        files_to_push(folder, ["../private.png"])


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_push_command_prints_what_it_sends_and_takes_include(tmp_path, tiny):
    from lab.local_hub import LocalHub

    hub = LocalHub(tmp_path / "hub-data").start()
    folder = tmp_path / "ckpt"
    save_checkpoint(tiny, folder)
    (folder / "my_keys.py").write_text("TOKEN = 'hf_secret'")
    (folder / "extra.png").write_bytes(b"\x89PNG extra")
    done = subprocess.run([sys.executable, "-m", "pape_hub_cli", "push", str(folder), "--repo-id", "org/exact",
                           "--include", "extra.png"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, **hub.client_env(), "HF_HOME": str(tmp_path / "hf_home")})
    hub.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pushing" in done.stderr and "extra.png" in done.stderr and "my_keys.py" not in done.stderr
    files = hub.files("org/exact")
    assert "extra.png" in files and "my_keys.py" not in files and MANIFEST not in files and "README.md" in files


# --- Medium: validation that is not there, and a resume on other data ---------------------------------------------
def shapes_folder(root: Path, per_class: int, classes: tuple[str, ...] = ("a", "b")) -> Path:
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def train_config(data: Path, out: Path, **kwargs):
    from pape_hub.training import TrainConfig

    settings = dict(model="vit_t4_ape", model_kwargs=dict(TINY, patch_size=4), dataset=f"imagefolder:{data}",
                    img_size=16, epochs=1, batch_size=2, output_dir=str(out), aug="none", quiet=True, num_workers=0)
    return TrainConfig(**{**settings, **kwargs})


def test_an_empty_validation_split_is_refused_by_name(tmp_path):
    from pape_hub.training import train

    data = shapes_folder(tmp_path / "one_each", per_class=1)
    with pytest.raises(ValueError, match="validation split .* is empty .* at least 2 images"):
        train(train_config(data, tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_resume_after_images_were_added_is_refused(tmp_path):
    from pape_hub.training import train

    data = shapes_folder(tmp_path / "shapes", per_class=6)
    train(train_config(data, tmp_path / "run", epochs=2, stop_after_epoch=1))
    shapes_folder(data, per_class=10)  # four more images per class: the validation cut changes
    with pytest.raises(ValueError, match="the data changed since it was saved"):
        train(train_config(data, tmp_path / "run", epochs=2, resume=str(tmp_path / "run")))


def test_an_output_folder_inside_the_dataset_is_refused(tmp_path):
    from pape_hub.training import train

    data = shapes_folder(tmp_path / "shapes", per_class=4)
    with pytest.raises(ValueError, match="lies inside the dataset"):
        train(train_config(data, data / "out"))


@pytest.mark.parametrize("folder", [".ipynb_checkpoints", "empty_class", "run_output"])
def test_class_folders_that_are_not_classes(tmp_path, folder):
    from pape_hub.data import build_data

    data = shapes_folder(tmp_path / "shapes", per_class=3)
    (data / folder).mkdir()
    if folder == "run_output":
        (data / folder / ".pape_hub_run.json").write_text("{}")
        (data / folder / "accuracy_vs_size.png").write_bytes(b"x")
    if folder == ".ipynb_checkpoints":  # skipped, as torchvision does
        assert build_data(f"imagefolder:{data}", img_size=16).classes == ["a", "b"]
        return
    with pytest.raises((ValueError, FileNotFoundError), match="holds no image files|pape_hub output folder"):
        build_data(f"imagefolder:{data}", img_size=16)


# --- Medium: a video frame past Pillow's pixel limit ---------------------------------------------------------------
def test_a_huge_video_frame_is_refused_before_decoding(tmp_path, monkeypatch):
    av = pytest.importorskip("av")
    from pape_hub.data.video import read_video

    path = tmp_path / "big.mp4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = 256, 256, "yuv420p"
        for _ in range(2):
            frame = av.VideoFrame.from_ndarray(np.zeros((256, 256, 3), np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 256 * 255)  # the frame is one row over the limit
    with pytest.raises(ValueError, match=r"256x256 frames .* over the limit"):
        read_video(path, 16)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 256 * 256)
    assert read_video(path, 4).shape == (4, 256, 256, 3)


# --- Low ----------------------------------------------------------------------------------------------------------
@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_card_leaves_a_readme_the_user_wrote(tmp_path, tiny):
    """`pape-hub card` refuses to replace a README it did not write, and replaces it with --overwrite: one client
    process runs the command line twice, reading the README between."""
    folder = tmp_path / "ckpt"
    save_checkpoint(tiny, folder)
    (folder / "README.md").write_text("# my own words")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        from pape_hub_cli import main
        readme = Path({str(folder / "README.md")!r})
        print("refused:", main(["card", {str(folder)!r}]), repr(readme.read_text()))
        print("overwrite:", main(["card", {str(folder)!r}, "--overwrite"]))
    """)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert "was not generated by pape_hub" in done.stderr, done.stderr
    assert "refused: 1 '# my own words'" in done.stdout, done.stdout + done.stderr
    assert "overwrite: 0" in done.stdout, done.stdout + done.stderr
    assert "generated by pape_hub" in (folder / "README.md").read_text()


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_card_with_a_bad_bench_writes_nothing(tmp_path, tiny):
    from pape_hub.evaluation import evaluate_checkpoint, save_evaluation

    folder = tmp_path / "ckpt"
    save_checkpoint(timm.create_model("vit_m12_ape", **TINY), folder, label_names=["up", "right", "down", "left"])
    save_evaluation(evaluate_checkpoint(folder, "arrows", sizes=[4], eval_size=8, progress=False), folder)
    (tmp_path / "bad.json").write_text(json.dumps({"runs": [{"rows": {}}]}))
    done = subprocess.run([sys.executable, "-m", "pape_hub_cli", "card", str(folder), "--bench",
                           str(tmp_path / "bad.json")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 1 and "is not a `python -m lab bench` result" in done.stderr
    assert not (folder / "comparison.json").exists()


def test_train_overwrite_keeps_the_users_hidden_files(tmp_path):
    from pape_hub.training.run_folder import _with_swap_names

    (tmp_path / ".results.json.orig").write_text("mine")
    (tmp_path / ".results.json.tmp-abcd1234").write_text("ours")
    (tmp_path / ".best.old").mkdir()
    names = {p.name for name in ("results.json", "best") for p in _with_swap_names(tmp_path, name)}
    assert names == {"results.json", "best", ".results.json.tmp-abcd1234", ".best.old"}


def test_save_into_a_linked_folder_writes_where_it_points(tmp_path, tiny):
    real = tmp_path / "disk" / "ckpt"
    save_checkpoint(tiny, real)
    (tmp_path / "link").symlink_to(real)
    save_checkpoint(tiny, tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and (real / "model.safetensors").exists()


def test_every_file_of_a_checkpoint_is_equally_readable(tmp_path, tiny):
    folder = save_checkpoint(tiny, tmp_path / "ckpt")
    modes = {stat.S_IMODE(p.stat().st_mode) & 0o444 for p in folder.iterdir()}
    assert modes == {0o444}, modes


def test_exif_orientation_and_float_tiffs_are_read_as_viewers_show_them(tmp_path):
    from pape_hub.data.images import open_image, to_8bit

    wide = Image.new("RGB", (40, 20), "white")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    wide.save(tmp_path / "rotated.jpg", exif=exif)
    assert open_image(tmp_path / "rotated.jpg").size == (20, 40)  # as transformers' pipeline reads it
    Image.fromarray(np.full((8, 8), 0.5, np.float32), mode="F").save(tmp_path / "float.tif")
    grey = to_8bit(open_image(tmp_path / "float.tif")).convert("L")
    assert np.asarray(grey).mean() == 128  # 0.5 of white, not black


def test_a_config_naming_a_hub_architecture_is_refused_without_contacting_the_hub(tmp_path, tiny):
    folder = save_checkpoint(tiny, tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    config["architecture"] = "hf-hub:org/x_ape"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no pape_hub model name"):
        load_checkpoint(folder)


@pytest.mark.parametrize("field,value,message", [("input_size", [3, 20000, 20000], "outside"),
                                                 ("std", [0.0, 0.2, 0.2], "must be positive"),
                                                 ("mean", [0.5, 0.5], "must be 3 finite numbers")])
def test_a_hostile_data_config_is_refused_by_name(tmp_path, tiny, field, value, message):
    folder = save_checkpoint(tiny, tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    config["pretrained_cfg"][field] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        load_checkpoint(folder)


def test_user_strings_reach_the_card_escaped(tmp_path, tiny):
    from pape_hub.card import card_dataset, plain

    assert plain("x`) <script>|y\n# z") == "x\\`) \\<script\\>\\|y \\# z"
    assert "<script>" not in card_dataset("imagefolder:<script>alert(1)</script>").description


def test_a_refused_transplant_leaves_the_target_as_it_was():
    from pape_hub import transplant

    source = timm.create_model("vit_t4_ape", embed_dim=32, depth=2, num_heads=2)
    target = timm.create_model("vit_t4_pape", embed_dim=32, depth=1, num_heads=2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError, match="left as it was"):
        transplant(source, target)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


#: in one process, after the first call wrote the cache: each junk content in turn, then a folder where the cache file
#: goes; each call prints the help as JSON (the cached text is read anew by every call)
JUNK_HELP_CACHE = """
import contextlib, io, json, sys
from pathlib import Path
import pape_hub_cli
cache = Path(sys.argv[1])
for content in ("[1, 2]", json.dumps({"card": "\\x1b[31mred\\x1b[0m"}), "x" * (2 << 20), None):
    if content is None:
        cache.unlink()
        cache.mkdir()  # a folder where the cache file goes: the call's temporary file is not left behind
    else:
        cache.write_text(content)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = pape_hub_cli.main(["card", "--help"])
    print(json.dumps([code, out.getvalue()]))
"""


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_help_cache_ignores_what_it_did_not_write(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    first = subprocess.run([sys.executable, "-m", "pape_hub_cli", "card", "--help"], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=120)
    assert first.stdout.startswith("usage: pape-hub card")
    cache = next((tmp_path / "pape_hub").glob("help-*.json"))
    junk = subprocess.run([sys.executable, "-c", JUNK_HELP_CACHE, str(cache)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)
    assert junk.returncode == 0 and "Traceback" not in junk.stderr, junk.stderr[-2000:]
    calls = [json.loads(line) for line in junk.stdout.splitlines()]
    assert [code for code, _ in calls] == [0] * 4 and not any("\x1b" in text for _, text in calls), calls
    assert [text == first.stdout for _, text in calls] == [True, False, True, True], calls  # the second: its own text
    assert not list((tmp_path / "pape_hub").glob(".help-*"))
