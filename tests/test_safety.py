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
    assert done.stdout.strip().endswith("False False") and "arrows" in done.stdout


def test_cli_version_errors_and_help_defaults():
    assert run_cli("--version").stdout.strip() == f"pape-hub {pape_hub.__version__}"
    bad = run_cli("train", "--epochs", "0", "--output-dir", "/nonexistent/never")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        "pape-hub train: error: epochs (--epochs) must be at least 1, got 0 (ValueError; --debug shows the traceback)"]
    debug = run_cli("train", "--epochs", "0", "--debug")
    assert "Traceback" in debug.stderr
    help_text = run_cli("train", "--help").stdout
    assert "(default: 8)" in help_text and "(default: vit_t4_rope_mixed)" in help_text
    assert '    pape-hub train --model vit_t4_pape --dataset digits --img-size 16 --aug none \\' in help_text
