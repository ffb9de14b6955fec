"""A new user's first hour, the parts fixed so far: the CLI's own train -> eval round trip for a patch-16 name, and
messages that name the fix."""

from __future__ import annotations

import json

import pytest

from pape_hub_cli import main


def test_train_then_eval_a_patch_16_model_on_arrows(tmp_path, capsys):
    """The eval sweep picks the arrow grids whose images are whole 16-px patches (4 and 8 of 4, 6, 8), instead of
    failing at grid 6 (72 px); an explicit unfit size is refused naming the ones that fit."""
    out = tmp_path / "run"
    assert main(["train", "--model", "vit_t16_pape", "--model-kwargs", '{"embed_dim": 32, "depth": 1, "num_heads": 2}',
                 "--dataset", "arrows", "--epochs", "1", "--train-size", "32", "--eval-size", "16", "--batch-size",
                 "16", "--output-dir", str(out), "--quiet"]) == 0
    assert main(["eval", str(out), "--eval-size", "16"]) == 0
    printed = capsys.readouterr().out
    assert "leaving out sizes [6]" in printed
    rows = json.loads((out / "best" / "eval.json").read_text())["rows"]
    assert sorted({r["size"] for r in rows}) == [4, 8]
    assert main(["eval", str(out), "--sizes", "4,6", "--eval-size", "16"]) == 1
    assert "use grids that are multiples of 4" in capsys.readouterr().err


@pytest.mark.parametrize("name,hint", [("vit_base_patch16_224", "vit_b16_ape"), ("vit_t4_pap", "did you mean")])
def test_an_unknown_model_name_gets_the_fix(tmp_path, capsys, name, hint):
    assert main(["train", "--model", name, "--dataset", "arrows", "--output-dir", str(tmp_path / "x")]) == 1
    assert hint in capsys.readouterr().err


def test_pretrained_weights_without_a_network_fail_fast_naming_the_ways_out(tmp_path):
    """Where the Hub cannot be reached and the weights are not cached, ``pretrained=True`` fails in seconds (not
    after huggingface_hub's minute of retries) with the offline routes; a cached or given file never asks."""
    import os
    import subprocess
    import sys
    import time

    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))  # nothing answers there
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "HF_HUB_OFFLINE"):
        env.pop(proxy, None)
    started = time.time()
    done = subprocess.run([sys.executable, "-c", "import pape_hub, timm\n"
                           "timm.create_model('vit_s16_rope_mixed.naver_in1k', pretrained=True)"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0 and time.time() - started < 30
    message = done.stderr.strip().splitlines()[-1]
    assert "cannot be reached" in message
    assert all(way in message for way in ("HF_HUB_OFFLINE=1", "local-dir:", "pretrained_cfg_overlay", "HF_ENDPOINT"))


def test_a_small_folder_keeps_every_image_and_hears_about_its_schedule(tmp_path, capsys):
    """40 images at the default batch of 128: the partial batch is kept (no 20% silently lost), the start-up line
    names the pixel size the images are trained at, and a note names the batch size that gives enough steps."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (tmp_path / "data" / cls).mkdir(parents=True)
        for i in range(20):
            pixels = rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / cls / f"{i}.png")
    assert main(["train", "--model", "vit_t4_rope_mixed", "--model-kwargs", '{"embed_dim": 32, "depth": 1, '
                 '"num_heads": 2, "img_size": 16}', "--dataset", f"imagefolder:{tmp_path / 'data'}", "--epochs", "2",
                 "--aug", "none", "--output-dir", str(tmp_path / "run")]) == 0
    printed = capsys.readouterr().out
    assert "36 training / 4 validation samples at 16x16 px (the model input size; --img-size changes it)" in printed
    assert "1 steps of 128 per epoch" in printed  # 36 images kept: the partial batch is the epoch
    assert "make 2 optimizer step(s) in 2 epochs" in printed and "--batch-size 8 gives 10" in printed
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert history[-1]["images_seen"] == 2 * 36


@pytest.mark.parametrize("command", ["card", "push"])
def test_card_and_push_of_a_training_folder_name_its_checkpoint(tmp_path, capsys, command):
    import timm

    from pape_hub.checkpoint import save_checkpoint

    save_checkpoint(timm.create_model("vit_m12_pape", depth=1), tmp_path / "run" / "best")
    args = [command, str(tmp_path / "run")] + (["--repo-id", "org/name"] if command == "push" else [])
    assert main(args) == 1
    assert f"pass its checkpoint {tmp_path / 'run' / 'best'}" in capsys.readouterr().err


def test_the_help_of_a_sub_action_shows_its_options(capsys):
    from lab.__main__ import LAB

    with pytest.raises(SystemExit) as done:
        LAB.main(["hub", "serve", "--help"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert all(flag in printed for flag in ("--port", "--data-dir", "--token"))


def test_a_folder_of_one_class_is_refused_by_name(tmp_path, capsys):
    """One class folder would train to validation 1.000 without a word: the command says why not and what to add,
    before anything is written."""
    import numpy as np
    from PIL import Image

    (tmp_path / "data" / "cats").mkdir(parents=True)
    for i in range(4):
        Image.fromarray(np.full((16, 16, 3), 40 * i, dtype=np.uint8)).save(tmp_path / "data" / "cats" / f"{i}.png")
    assert main(["train", "--model", "vit_t4_pape", "--dataset", f"imagefolder:{tmp_path / 'data'}", "--epochs", "1",
                 "--output-dir", str(tmp_path / "run"), "--quiet"]) == 1
    assert "holds one class (cats)" in capsys.readouterr().err and not (tmp_path / "run").exists()
