"""Bad input gets a clear error before any work starts, and nothing the user saved is lost: output folders,
argument values, resuming, evaluation labels, config.json agreement, weight files, the command line; plus the
weight-decay groups the README promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import timm
import torch
from filelock import FileLock
from safetensors.torch import load_file, save_file
from test_data import make_imagefolder
from test_training import arrow_config

import pape_hub
from pape_hub.checkpoint import load_checkpoint, save_checkpoint
from pape_hub.evaluation import evaluate_checkpoint
from pape_hub.training import LOCK_NAME, TrainConfig, train

ROOT = Path(__file__).resolve().parent.parent


# --- output folders ----------------------------------------------------------------------------------
def test_a_second_run_into_a_used_folder_is_refused_and_overwrite_replaces_it(tmp_path):
    train(arrow_config(tmp_path, epochs=1))
    before = (tmp_path / "run" / "best" / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="already holds a run.*--resume.*--overwrite"):
        train(arrow_config(tmp_path, epochs=1, seed=5))
    assert (tmp_path / "run" / "best" / "model.safetensors").read_bytes() == before  # untouched
    train(arrow_config(tmp_path, epochs=1, seed=5, overwrite=True))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads((tmp_path / "run" / "results.json").read_text())["history"][0]["epoch"] == 0


def test_two_runs_cannot_write_one_folder_at_once(tmp_path):
    (tmp_path / "run").mkdir()
    with FileLock(str(tmp_path / "run" / LOCK_NAME)):  # another run holds the folder
        with pytest.raises(RuntimeError, match="another run is writing to"):
            train(arrow_config(tmp_path, epochs=1))
    assert not (tmp_path / "run" / "best").exists()


# --- argument values ---------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,flag", [
    ("epochs", 0, "--epochs"), ("epochs", -1, "--epochs"), ("stop_after_epoch", 0, "--stop-after-epoch"),
    ("lr", 0.0, "--lr"), ("grad_accum", 0, "--grad-accum"), ("batch_size", 0, "--batch-size"),
    ("aug", "heavy", "--aug"), ("crop_scale", (0.9, 0.1), "--crop-scale"), ("label_smoothing", 1.0,
                                                                             "--label-smoothing"),
])
def test_values_that_cannot_train_are_refused_by_name(field, value, flag):
    with pytest.raises(ValueError, match=f"{field} \\({flag}\\)"):
        TrainConfig(**{field: value})


# --- resuming ----------------------------------------------------------------------------------------
def test_resume_refuses_changed_hyperparameters_unless_told(tmp_path):
    train(arrow_config(tmp_path, epochs=3, stop_after_epoch=1))
    with pytest.raises(ValueError, match="other hyper-parameters \\(lr: saved 0.002, now 0.001.*batch_size"):
        train(arrow_config(tmp_path, epochs=3, lr=1e-3, batch_size=16, resume=str(tmp_path / "run")))
    results = train(arrow_config(tmp_path, epochs=3, lr=1e-3, resume=str(tmp_path / "run"),
                                 allow_changed_hparams=True))
    assert [h["epoch"] for h in results["history"]] == [0, 1, 2]


def test_resume_refuses_a_state_without_random_number_state(tmp_path):
    train(arrow_config(tmp_path, epochs=2, stop_after_epoch=1))
    for rng in (tmp_path / "run" / "state").glob("random_states*.pkl"):
        rng.unlink()
    with pytest.raises(FileNotFoundError, match="cannot resume exactly.*random-number state"):
        train(arrow_config(tmp_path, epochs=2, resume=str(tmp_path / "run")))


# --- evaluation labels -------------------------------------------------------------------------------
def test_evaluating_on_a_dataset_with_other_classes_is_refused(tmp_path):
    make_imagefolder(tmp_path / "pets", classes=("cat", "dog"), size=16)
    make_imagefolder(tmp_path / "farm", classes=("cow", "dog"), size=16)
    cfg = TrainConfig(model="vit_t4_rope", model_kwargs=dict(embed_dim=32, depth=2, num_heads=2), epochs=1,
                      dataset=f"imagefolder:{tmp_path / 'pets'}", batch_size=4, img_size=16, aug="none",
                      output_dir=str(tmp_path / "run"), quiet=True, val_fraction=0.34)
    train(cfg)
    with pytest.raises(ValueError, match="classes \\['cow', 'dog'\\] but the checkpoint was trained on \\['cat'"):
        evaluate_checkpoint(tmp_path / "run" / "best", f"imagefolder:{tmp_path / 'farm'}")


# --- weight decay ------------------------------------------------------------------------------------
#: every position parameter, per encoding (parameters that are functions of position alone)
POSITION_PARAMETERS = {
    "ape": {"pos_encoding.pos_embed"}, "rope_mixed": {"pos_encoding.freqs"}, "pape": {"pos_encoding.position_proj"},
    "sape2": {"pos_encoding.pos_emb"}, "sape2_ape": {"pos_encoding.pos_emb", "pos_encoding.absolute.pos_embed"},
    "liere8": {"pos_encoding.generators"}, "liere": {"pos_encoding.generators"},
    "rope_ape": {"pos_encoding.absolute.pos_embed"},
    "rope_mixed_ape": {"pos_encoding.freqs", "pos_encoding.absolute.pos_embed"},
}


@pytest.mark.parametrize("encoding", pape_hub.list_encodings())
def test_optimizer_groups_exclude_exactly_position_parameters_norms_and_biases(encoding):
    model = timm.create_model(f"vit_t4_{encoding}", embed_dim=32, depth=2, num_heads=2)
    optimizer = timm.optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    expected = {n for n, p in model.named_parameters() if p.ndim <= 1} | {"cls_token"}
    expected |= POSITION_PARAMETERS.get(encoding, set())
    assert no_decay == expected
    content = {"pape": "pos_encoding.curvature_proj", "pape_ri": "pos_encoding.curvature_proj"}.get(encoding)
    if content:  # projections of token content decay like any linear layer
        assert content not in no_decay


# --- config.json and weight files --------------------------------------------------------------------
def tiny_checkpoint(tmp_path, encoding="pape"):
    model = timm.create_model(f"vit_t4_{encoding}", embed_dim=32, depth=2, num_heads=2, num_classes=3).eval()
    return model, save_checkpoint(model, tmp_path / encoding, label_names=["a", "b", "c"])


def test_config_json_that_disagrees_with_itself_is_refused_by_both_faces(tmp_path):
    from transformers import AutoModelForImageClassification

    _, folder = tiny_checkpoint(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["model_args"]["position_encoding"] = "rope"  # a hand edit of one of the two copies
    (folder / "config.json").write_text(json.dumps(config))
    for load in (lambda: timm.create_model(f"local-dir:{folder}", pretrained=True),
                 lambda: AutoModelForImageClassification.from_pretrained(folder),
                 lambda: load_checkpoint(folder)):
        with pytest.raises(ValueError, match="disagrees with itself.*model_args.position_encoding = 'rope'"):
            load()


def test_weights_missing_encoding_parameters_are_an_error_not_a_random_init(tmp_path):
    from transformers import AutoModelForImageClassification

    _, folder = tiny_checkpoint(tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    state = {k: v for k, v in state.items() if "pos_encoding" not in k}  # e.g. weights of another encoding
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="does not match this 'pape' model.*missing \\['vit.pos_encoding"):
        AutoModelForImageClassification.from_pretrained(folder)
    with pytest.raises(ValueError, match="does not match"):
        load_checkpoint(folder)


def test_save_checkpoint_takes_either_face_and_results(tmp_path):
    model, folder = tiny_checkpoint(tmp_path)
    hf = pape_hub.hf.timm_to_transformers(model, ["a", "b", "c"])
    again = save_checkpoint(hf, tmp_path / "from_hf", results={"rows": []})
    assert json.loads((again / "eval.json").read_text()) == {"rows": []}
    a, _ = load_checkpoint(folder)
    b, config = load_checkpoint(again)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(a.eval()(x), b.eval()(x)) and config["label_names"] == ["a", "b", "c"]


# --- the command line --------------------------------------------------------------------------------
def run_cli(*args, **env):
    return subprocess.run([sys.executable, "-m", "pape_hub_cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, **env), timeout=300)


def test_cli_help_is_fast_and_imports_no_torch():
    code = ("import sys, pape_hub_cli\ntry:\n    pape_hub_cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'pape_hub' in sys.modules)")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert time.perf_counter() - started < 5
    assert done.stdout.strip().endswith("False False") and "convert" in done.stdout
    assert "arrows" not in done.stdout  # the lab's commands are not the installed package's


def test_cli_version_errors_and_help_defaults(capsys, tmp_path, monkeypatch):
    from pape_hub_cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the help cache, not the user's

    assert run_cli("--version").stdout.strip() == f"pape-hub {pape_hub.__version__}"
    assert main(["train", "--epochs", "0", "--output-dir", "/nonexistent/never"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "pape-hub train: error: epochs (--epochs) must be at least 1, got 0 (ValueError; --debug shows the traceback)"]
    with pytest.raises(ValueError, match="epochs"):  # --debug: the exception itself, with its traceback
        main(["train", "--epochs", "0", "--debug"])
    assert main(["train", "--help"]) == 0
    help_text = capsys.readouterr().out
    words = " ".join(help_text.split())
    assert "(default: 8)" in words and "(default: vit_m12_rope_mixed)" in words
    assert '    pape-hub train --model vit_t4_pape --dataset digits --img-size 16 --aug none \\' in help_text


def test_command_help_is_the_parsers_own_text_and_then_needs_no_import(tmp_path):
    """``pape-hub COMMAND --help`` renders the parser once and keeps the text in a per-user cache (nothing is
    committed); the next call prints it without importing torch or pape_hub. Editing the package's code makes a
    new cache key, so the help is never stale."""
    from pape_hub_cli import COMMANDS, PAPE_HUB

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    code = ("import sys, pape_hub_cli\nrc = pape_hub_cli.main(['train', '--lr', '1', '--help'])\n"
            "print(rc, 'torch' in sys.modules, 'pape_hub' in sys.modules)")
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    expected = PAPE_HUB.command_parser("train")[0].format_help()
    assert first.stdout.startswith(expected) and first.stdout.strip().endswith("0 True True")
    assert second.stdout.startswith(expected) and second.stdout.strip().endswith("0 False False")
    assert [p.name.startswith("help-pape_hub.commands-") for p in (tmp_path / "pape_hub").iterdir()] == [True]
    for name in COMMANDS:  # one description per command: the summary here, then its module's details
        assert PAPE_HUB.command_parser(name)[0].description.startswith(COMMANDS[name])


# --- the security issue: overwrite, interrupted swaps, non-finite settings, 16-bit images, NaN inputs -----------
def user_files(folder):
    (folder / "data").mkdir(parents=True)
    (folder / "thesis.txt").write_text("four years of work")
    (folder / "data" / "important.csv").write_text("a,b\n1,2\n")
    return {"thesis.txt": "four years of work", "data/important.csv": "a,b\n1,2\n"}


def test_overwrite_checks_everything_first_and_removes_only_what_a_run_wrote(tmp_path):
    train(arrow_config(tmp_path, epochs=1))
    run = tmp_path / "run"
    kept = user_files(run)
    before = (run / "best" / "model.safetensors").read_bytes()
    with pytest.raises(FileNotFoundError):  # a dataset that does not exist: nothing in the folder is touched
        train(arrow_config(tmp_path, epochs=1, seed=5, overwrite=True, dataset="imagefolder:/does/not/exist"))
    assert (run / "best" / "model.safetensors").read_bytes() == before
    train(arrow_config(tmp_path, epochs=1, seed=5, overwrite=True))
    assert all((run / name).read_text() == text for name, text in kept.items())  # the user's files survive
    assert (run / "best" / "model.safetensors").read_bytes() != before  # the earlier run's outputs were replaced
    assert not (run / LOCK_NAME).exists()  # no empty lock file left behind
    assert oct((run / "results.json").stat().st_mode & 0o777) == "0o644"


def test_overwrite_refuses_files_in_the_way_that_no_run_wrote(tmp_path):
    run = tmp_path / "run"
    kept = user_files(run)
    (run / "metrics.jsonl").write_text("my own notes\n")  # a name the run writes, but not written by a run
    with pytest.raises(FileExistsError, match="metrics.jsonl, which no pape_hub run wrote there"):
        train(arrow_config(tmp_path, epochs=1, overwrite=True))
    assert (run / "metrics.jsonl").read_text() == "my own notes\n"
    (run / "metrics.jsonl").unlink()
    train(arrow_config(tmp_path, epochs=1, overwrite=True))  # the user's other files stay where they are
    assert all((run / name).read_text() == text for name, text in kept.items())


@pytest.mark.parametrize("interrupted", ["between_renames", "before_moving_in"])
def test_a_kill_during_the_state_swap_resumes_exactly(tmp_path, interrupted):
    from test_training import assert_same_weights, weights

    straight = train(arrow_config(tmp_path, name="straight", epochs=3))
    train(arrow_config(tmp_path, epochs=3, stop_after_epoch=2))
    run = tmp_path / "run"
    if interrupted == "between_renames":  # `state` moved aside, the new copy not yet moved in
        os.replace(run / "state", run / ".state.old")
    else:  # the new copy complete but not yet in place; `state` still holds the epoch before
        os.replace(run / "state", run / ".state.new")
        (run / "state").mkdir()
        (run / "state" / "trainer_state.json").write_text("{}")
    (run / ".state.tmp").mkdir()  # what a kill during a save leaves: incomplete, never used
    resumed = train(arrow_config(tmp_path, epochs=3, resume=str(run)))
    assert [h["epoch"] for h in resumed["history"]] == [0, 1, 2]
    assert_same_weights(weights(run), weights(tmp_path / "straight"))
    assert resumed["test"] == straight["test"]


def test_loading_finds_the_newest_complete_checkpoint(tmp_path):
    train(arrow_config(tmp_path, epochs=1))
    best = tmp_path / "run" / "best"
    os.replace(best, best.with_name(".best.old"))  # killed between the two renames of a save
    model, config = load_checkpoint(best)
    assert config["architecture"] == "vit_t4_pape"


@pytest.mark.parametrize("field,value", [
    ("lr", float("inf")), ("lr", 1e30), ("lr", float("nan")), ("clip_grad", float("nan")),
    ("weight_decay", float("nan")), ("drop_path", float("nan")), ("mixup", float("nan")), ("hflip", float("nan")),
    ("cutmix", float("inf")), ("min_lr", float("nan")), ("warmup_epochs", float("inf")), ("drop_path", 1.0),
    ("crop_scale", (0.5, float("nan"))), ("color_jitter", -1.0), ("model_kwargs", 5),
])
def test_non_finite_and_out_of_range_settings_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"{field} \\(--{field.replace('_', '-')}\\)"):
        TrainConfig(**{field: value})


@pytest.mark.parametrize("kwargs,message", [
    ({"num_parabolas": 0}, "num_parabolas=0 must be finite and positive"),
    ({"num_parabolas": -1}, "num_parabolas=-1 must be finite and positive"),
    ({"num_parabolas": "x"}, "num_parabolas='x' must be an integer"),
    ({"position_scale": float("nan")}, "position_scale=nan must be finite and positive"),
    (5, "position_encoding_kwargs of 'pape' must be a dict"),
    ({"parabolas": 3}, "unknown argument\\(s\\) \\['parabolas'\\]"),
])
def test_bad_encoding_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        timm.create_model("vit_t4_pape", position_encoding_kwargs=kwargs)


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    from pape_hub.training import loop

    build = loop.build_model
    calls = {"n": 0}

    def poisoned(*args, **kwargs):  # the model's output turns NaN in the second epoch (4 steps per epoch)
        model = build(*args, **kwargs)

        def hook(module, inputs, output):
            calls["n"] += module.training
            return output * float("nan") if module.training and calls["n"] > 5 else output
        model.register_forward_hook(hook)
        return model

    monkeypatch.setattr(loop, "build_model", poisoned)
    with pytest.raises(FloatingPointError, match="training loss is nan at epoch 2, step 2.*last good checkpoint"):
        train(arrow_config(tmp_path, epochs=3))
    config = json.loads((tmp_path / "run" / "last" / "config.json").read_text())
    assert config["pape_hub"]["epoch"] == 0
    assert all(torch.isfinite(t).all() for t in load_file(str(tmp_path / "run" / "last" / "model.safetensors"))
               .values())
    assert not (tmp_path / "run" / "results.json").exists()


def test_sixteen_bit_images_are_scaled_not_saturated(tmp_path):
    import numpy as np
    from PIL import Image

    from pape_hub.data import build_data

    for split in ("train", "test"):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(4):
                ramp = np.linspace(0, 65535, 16 * 16).reshape(16, 16).astype(np.uint16)
                Image.fromarray(ramp).save(tmp_path / split / c / f"{i}.png")
    assert Image.open(tmp_path / "train" / "a" / "0.png").mode == "I;16"
    data = build_data(f"imagefolder:{tmp_path}", img_size=16, val_fraction=0.25)
    image = np.asarray(data.train.dataset.with_transform(None)[0][0] if hasattr(data.train, "dataset")
                       else data.train.with_transform(None)[0][0])
    assert image.min() == 0 and image.max() == 255 and (image == 255).mean() < 0.02  # not 99.6% white
    assert abs(image.mean() - 127.5) < 2


def test_sape2_keeps_a_nan_in_its_own_sample_like_every_encoding(tmp_path):
    torch.manual_seed(0)
    model = timm.create_model("vit_t4_sape2", embed_dim=32, depth=2, num_heads=2, num_classes=3).eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        clean = model(x)
        x[1, 0, 5, 5] = float("nan")
        dirty = model(x)
    assert torch.isnan(dirty[1]).all() and torch.allclose(dirty[[0, 2]], clean[[0, 2]], atol=1e-6)


def test_a_config_json_that_is_not_an_object_is_named(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("[]")
    with pytest.raises(ValueError, match="config.json must hold a JSON object of model settings, got a JSON list"):
        load_checkpoint(folder)


def test_eval_refuses_another_task_by_name_and_takes_a_training_folder(tmp_path, capsys):
    from pape_hub_cli import main

    digits = train(TrainConfig(model="vit_t4_ape", model_kwargs=dict(patch_size=2, in_chans=1, embed_dim=32, depth=1,
                                                                     num_heads=2), img_size=16, dataset="digits",
                               epochs=1, batch_size=128, aug="none", output_dir=str(tmp_path / "digits"),
                               quiet=True))
    assert digits["best_epoch"] == 0
    assert main(["eval", str(tmp_path / "digits" / "best"), "--dataset", "arrows"]) == 1
    assert "was trained on 'digits', not 'arrows'" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "digits"), "--resolutions", "16", "--patch-shuffle", "none"]) == 0
    out = capsys.readouterr().out
    assert "training output folder" in out and (tmp_path / "digits" / "best" / "eval.json").exists()


def test_every_option_of_every_command_shows_its_default():
    """``--help`` names each option's default (a help text that already states one is kept as written)."""
    import argparse

    from lab.__main__ import LAB
    from pape_hub_cli import PAPE_HUB, HelpFormatter

    for command_line, name in [(c, n) for c in (PAPE_HUB, LAB) for n in c.commands]:
        parser, _ = command_line.command_parser(name)
        formatter = HelpFormatter(prog=f"pape-hub {name}")
        for action in parser._actions:
            if not action.option_strings or action.default in (None, argparse.SUPPRESS, False, True):
                continue
            line = formatter._format_action(action)
            assert "default" in line, (name, action.option_strings, line)
            assert line.count("(default") <= 1, (name, line)


WORKER_PARENT = '''
import multiprocessing, os, time
from concurrent.futures import ProcessPoolExecutor
from lab.experiment import _exit_with_parent

if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_exit_with_parent)
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 600)  # the worker is busy when its command is killed
    time.sleep(600)
'''


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
def test_workers_stop_when_their_command_is_killed(tmp_path):
    """`python -m lab arrows` / `compare` killed: their worker processes stop too, instead of training on into folders
    that a re-run of the command then finds written by no run it knows."""
    script = tmp_path / "command.py"
    script.write_text(WORKER_PARENT)
    command = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))  # the lab runs from the checkout
    try:
        worker = int(command.stdout.readline())
        time.sleep(0.5)
        assert running(worker)
        command.kill()
        command.wait()
        deadline = time.time() + 15
        while running(worker) and time.time() < deadline:
            time.sleep(0.2)
        assert not running(worker)
    finally:
        command.kill()
