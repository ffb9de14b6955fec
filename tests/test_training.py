"""A few steps of real training: checkpoints, exact resume (also after an interruption), evaluation, errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_data import make_imagefolder

from pape_hub.card import write_model_card
from pape_hub.checkpoint import load_checkpoint
from pape_hub.data import ArrowConfig, arrow_statistics
from pape_hub.evaluation import evaluate_checkpoint, shuffle_tiles
from pape_hub.training import TrainConfig, train
from pape_hub_cli import main

TINY_ARROW_MODEL = dict(patch_size=12, embed_dim=32, depth=2, num_heads=2, global_pool="avg", class_token=False)


def arrow_config(tmp_path, name="run", **overrides) -> TrainConfig:
    values = dict(model="vit_t4_pape", model_kwargs=TINY_ARROW_MODEL, dataset="arrows", epochs=2, batch_size=32,
                  train_size=128, eval_size=64, output_dir=str(tmp_path / name), quiet=True, seed=1,
                  label_smoothing=0.0, drop_path=0.0)
    values.update(overrides)
    return TrainConfig(**values)


def weights(run_dir, which="last"):
    return load_file(str(run_dir / which / "model.safetensors"))


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_train_writes_checkpoints_and_results(tmp_path):
    results = train(arrow_config(tmp_path))
    run = tmp_path / "run"
    for item in ("best/model.safetensors", "best/config.json", "last/model.safetensors", "state/trainer_state.json",
                 "metrics.jsonl", "results.json", "training_curve.png"):
        assert (run / item).exists(), item
    assert (run / "training_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [0, 1]
    assert "test" in results and 0 <= results["test"]["top1"] <= 1
    config = json.loads((run / "best" / "config.json").read_text())
    assert config["architecture"] == "vit_t4_pape" and config["label_names"] == ["up", "right", "down", "left"]
    assert config["position_encoding"] == "pape" and config["pape_hub"]["dataset"]["train"]["grid"] == 4
    assert "encoding" not in config["pape_hub"]  # stated once, as position_encoding
    model, _ = load_checkpoint(run / "best")
    assert model.num_classes == 4
    # the same folder through the transformers face (and the normalisation the arrow images use)
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    hf = AutoModelForImageClassification.from_pretrained(run / "best").eval()
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert torch.equal(hf(x).logits, model.eval()(x))
    assert hf.config.id2label[0] == "up"
    mean, std = arrow_statistics(ArrowConfig())  # the arrow task's own statistics, recorded for both faces
    assert AutoImageProcessor.from_pretrained(run / "best").image_mean == pytest.approx([mean] * 3, abs=1e-6)
    assert model.pretrained_cfg["std"] == pytest.approx([std] * 3, abs=1e-6)


@pytest.mark.parametrize("arrow", [{}, {"isolated": True}, {"num_letters": 2, "hard_negatives": 1}])
def test_evaluation_reproduces_the_training_test_accuracy(tmp_path, arrow):
    """The sweep at the training grid scores the same test images - the same task variant, with the checkpoint's
    own normalisation - as training's own test."""
    results = train(arrow_config(tmp_path, epochs=2, train_size=256, arrow=arrow))
    sweep = evaluate_checkpoint(tmp_path / "run" / "best", "arrows", sizes=[4, 5], eval_size=64)
    at_train_grid = [r for r in sweep.rows if r.size == 4 and not r.patch_shuffle]
    assert len(at_train_grid) == 1  # interpolation at the training grid would repeat the same numbers
    assert at_train_grid[0].top1 == results["test"]["top1"] and at_train_grid[0].count == 64


def test_resume_continues_exactly(tmp_path):
    train(arrow_config(tmp_path, "straight", epochs=3))
    train(arrow_config(tmp_path, "split", epochs=3, stop_after_epoch=1))  # the schedule still spans 3 epochs
    train(arrow_config(tmp_path, "split", epochs=3, resume=str(tmp_path / "split")))
    assert_same_weights(weights(tmp_path / "straight"), weights(tmp_path / "split"))
    history = json.loads((tmp_path / "split" / "results.json").read_text())["history"]
    assert [h["epoch"] for h in history] == [0, 1, 2]


def test_a_run_saved_before_recipes_resumes(tmp_path):
    """A state written before recipes existed (no `recipe`, no clipping saved as None) continues as it was."""
    train(arrow_config(tmp_path, "old", epochs=2, stop_after_epoch=1, clip_grad=0.0))
    state = tmp_path / "old" / "state" / "trainer_state.json"
    saved = json.loads(state.read_text())
    del saved["config"]["recipe"], saved["config"]["crop_padding"]
    saved["config"]["clip_grad"] = None
    state.write_text(json.dumps(saved))
    train(arrow_config(tmp_path, "old", epochs=2, clip_grad=0.0, resume=str(tmp_path / "old")))
    assert len(json.loads((tmp_path / "old" / "results.json").read_text())["history"]) == 2


def test_interrupted_run_loses_at_most_the_current_epoch(tmp_path, monkeypatch):
    train(arrow_config(tmp_path, "straight", epochs=2))
    from pape_hub.training import loop

    original = loop.evaluate_loader
    calls = {"n": 0}

    def dying_evaluate(*args, **kwargs):  # dies at the end of epoch 2, before that epoch is saved
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate_loader", dying_evaluate)
    with pytest.raises(KeyboardInterrupt):
        train(arrow_config(tmp_path, "killed", epochs=2))
    monkeypatch.setattr(loop, "evaluate_loader", original)
    saved = json.loads((tmp_path / "killed" / "state" / "trainer_state.json").read_text())
    assert saved["epoch"] == 0  # epoch 1 is on disk, intact
    train(arrow_config(tmp_path, "killed", epochs=2, resume=str(tmp_path / "killed")))
    assert_same_weights(weights(tmp_path / "straight"), weights(tmp_path / "killed"))


def test_resume_of_another_model_is_refused(tmp_path):
    train(arrow_config(tmp_path, "a", epochs=1))
    with pytest.raises(ValueError, match="cannot resume.*vit_t4_pape.*vit_t4_rope"):
        train(arrow_config(tmp_path, "b", model="vit_t4_rope", resume=str(tmp_path / "a")))
    with pytest.raises(FileNotFoundError, match="cannot resume"):
        train(arrow_config(tmp_path, "c", resume=str(tmp_path / "missing")))


def test_evaluate_sweep_and_patch_shuffle(tmp_path):
    train(arrow_config(tmp_path, epochs=1))
    result = evaluate_checkpoint(tmp_path / "run" / "best", "arrows", sizes=[4, 6], eval_size=32)
    sizes = {(r.size, r.interpolation, r.patch_shuffle) for r in result.rows}
    assert sizes == {(4, False, False), (4, False, True), (6, False, False), (6, True, False)}
    assert result.label == "pape" and result.trained_at == 4
    card = write_model_card(tmp_path / "run" / "best", result, plot="plot.png").read_text()
    assert card.startswith("---\n") and "pipeline_tag: image-classification" in card
    top1 = result.accuracy(6)
    assert f"{top1:.3f}" in card and "Patch-shuffle" in card and "`pape`" in card


def test_shuffle_patches_permutes_tiles():
    images = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).reshape(2, 1, 4, 4)
    out = shuffle_tiles(images, (2, 2), torch.Generator().manual_seed(0))
    tiles = lambda t: sorted(t.unfold(1, 2, 2).unfold(2, 2, 2).reshape(-1, 4).tolist())  # noqa: E731
    for a, b in zip(images, out):
        assert tiles(a[0][None]) == tiles(b[0][None])


def test_default_natural_image_recipe_trains(tmp_path):
    """The default recipe (DeiT: random-resized crop, flip, jitter, RandAugment, Mixup/CutMix) on an image folder:
    three epochs draw a few hundred RandAugment ops (the pinned Pillow accepts timm's posterize levels)."""
    make_imagefolder(tmp_path / "data", size=16, per_class=12)
    cfg = TrainConfig(model="vit_t4_rope", model_kwargs=dict(embed_dim=32, depth=2, num_heads=2), epochs=3,
                      dataset=f"imagefolder:{tmp_path / 'data'}", batch_size=4, output_dir=str(tmp_path / "img"),
                      img_size=16, val_fraction=0.25, quiet=True)
    assert cfg.augmentation()["randaugment"] == "rand-m9-mstd0.5-inc1" and cfg.augmentation()["mixup"] == 0.8
    results = train(cfg)
    assert results["test"]["count"] == 24
    config = json.loads((tmp_path / "img" / "best" / "config.json").read_text())
    assert config["pape_hub"]["dataset"]["spec"] == "imagefolder:data"  # no absolute path in the checkpoint
    assert config["pape_hub"]["recipe"]["augmentation"] == "default"


def test_grey_digits_train_without_augmentation(tmp_path):
    cfg = TrainConfig(model="vit_t4_pape", model_kwargs=dict(embed_dim=32, depth=2, num_heads=2, patch_size=2,
                                                               in_chans=1, global_pool="avg", class_token=False),
                      dataset="digits", img_size=16, epochs=1, batch_size=64, aug="none",
                      output_dir=str(tmp_path / "digits"), quiet=True)
    aug = cfg.augmentation()
    assert aug["crop_scale"] is None and aug["randaugment"] == "" and aug["mixup"] == 0
    results = train(cfg)
    assert results["test"]["count"] == 599
    model, config = load_checkpoint(tmp_path / "digits" / "best")
    assert model.patch_embed.proj.in_channels == 1 and len(config["pretrained_cfg"]["mean"]) == 1
    sweep = evaluate_checkpoint(tmp_path / "digits" / "best", "digits", resolutions=[16, 24])
    assert set(sweep.sizes()) == {16, 24}


def test_cli_train_and_eval(tmp_path, capsys):
    assert main(["train", "--model", "vit_t4_rope_mixed", "--model-kwargs", json.dumps(TINY_ARROW_MODEL),
                 "--epochs", "1", "--train-size", "64", "--eval-size", "32", "--batch-size", "32",
                 "--output-dir", str(tmp_path / "cli")]) == 0
    assert main(["eval", str(tmp_path / "cli" / "best"), "--sizes", "4,5", "--eval-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "best val top-1" in out
    best = tmp_path / "cli" / "best"  # the evaluation lands in the checkpoint folder, where its card finds it
    assert (best / "eval.json").exists() and (best / "accuracy_vs_size.png").exists()
    assert main(["card", str(best)]) == 0
    card = (best / "README.md").read_text()
    assert "No evaluation was run" not in card and "accuracy_vs_size.png" in card


def test_bad_training_input(tmp_path):
    with pytest.raises(ValueError, match="unknown pape_hub model"):
        train(arrow_config(tmp_path, model="vit_x4_pape"))
    with pytest.raises(ValueError, match="does not match the arrows images"):
        train(arrow_config(tmp_path, img_size=32))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train(arrow_config(tmp_path, dataset=f"imagefolder:{tmp_path / 'none'}", img_size=48))
    make_imagefolder(tmp_path / "data", size=16)
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        train(arrow_config(tmp_path, dataset=f"imagefolder:{tmp_path / 'data'}", img_size=30, batch_size=4))


def test_corrupt_checkpoint_is_named(tmp_path):
    train(arrow_config(tmp_path, epochs=1))
    (tmp_path / "run" / "best" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="corrupt"):
        load_checkpoint(tmp_path / "run" / "best")


def test_cpu_training_flushes_subnormal_floats_for_the_run_only(tmp_path, monkeypatch):
    """Subnormal floats make PaPE's softmax backward ~3x slower on x86: the run zeroes them while it fits and leaves
    the process as it found it (torch's switch is process-wide), so a user's later CPU arithmetic is untouched."""
    from pape_hub.training import loop

    seen = []
    fit = loop.fit

    def watched_fit(*args, **kwargs):
        seen.append((torch.tensor([1e-39]) * 1.0).item())
        return fit(*args, **kwargs)

    monkeypatch.setattr(loop, "fit", watched_fit)
    torch.set_flush_denormal(False)
    train(arrow_config(tmp_path, epochs=1, train_size=64))
    assert seen == [0.0]
    assert (torch.tensor([1e-39]) * 1.0).item() != 0.0


def test_digits_take_their_input_setting_unless_given():
    """`pape-hub train --dataset digits` (the obvious first try) shows 8x8 grey digits as the README's table does;
    anything given explicitly wins."""
    import argparse

    from pape_hub.commands.train import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = config_from_args(parser.parse_args(["--dataset", "digits", "--model", "vit_t4_pape"]))
    assert (cfg.img_size, cfg.aug, cfg.model_kwargs) == (16, "none", {"patch_size": 2, "in_chans": 1})
    given = config_from_args(parser.parse_args(["--dataset", "digits", "--img-size", "24", "--aug", "light",
                                                "--model-kwargs", '{"patch_size": 4}']))
    assert (given.img_size, given.aug, given.model_kwargs) == (24, "light", {"patch_size": 4, "in_chans": 1})
    assert config_from_args(parser.parse_args([])).img_size is None  # other datasets: untouched


def test_every_train_flag_is_made_from_the_field_it_fills():
    """Each TrainConfig field (and each arrow / motion setting, as --arrow-* / --motion-*) is a flag with the
    field's help and default; parsing no flags gives TrainConfig's own defaults, and a flag reaches its field."""
    import argparse
    import dataclasses

    from pape_hub.commands.train import add_arguments, config_from_args
    from pape_hub.data import EventConfig, MotionConfig, ShapeConfig

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    actions = {a.dest: a for a in parser._actions}
    for f in dataclasses.fields(TrainConfig):
        if f.metadata.get("flag") is False:
            continue
        assert f.name in actions and actions[f.name].help == f.metadata["help"] and f.metadata["help"], f.name
    for prefix, config in (("arrow", ArrowConfig), ("motion", MotionConfig), ("shapes", ShapeConfig),
                           ("events", EventConfig)):
        for f in dataclasses.fields(config):
            assert actions[f"{prefix}_{f.name}"].default in (f.default, False), f.name
    assert asdict_without(config_from_args(parser.parse_args([]))) == asdict_without(TrainConfig())
    cfg = config_from_args(parser.parse_args(["--lr", "0.01", "--crop-scale", "0.5,1", "--arrow-arrows", "8",
                                              "--keep-denormals", "--model-kwargs", '{"depth": 2}']))
    assert (cfg.lr, cfg.crop_scale, cfg.arrow["num_arrows"], cfg.flush_denormals, cfg.model_kwargs) == \
        (0.01, (0.5, 1.0), 8, False, {"depth": 2})
    with pytest.raises(SystemExit):  # a malformed value is refused by the flag's own type
        parser.parse_args(["--model-kwargs", "[1, 2]"])


def asdict_without(cfg, names=("arrow", "motion", "shapes", "events")):
    import dataclasses

    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in names}


def test_on_epoch_reports_each_finished_epoch(tmp_path):
    seen = []
    train(arrow_config(tmp_path, epochs=2), on_epoch=lambda record: seen.append(record["epoch"]))
    assert seen == [0, 1]


def test_saving_draws_no_random_numbers(tmp_path):
    """save_checkpoint writes the model's own tensors (no second model is built and initialised), so saving in the
    middle of seeded work changes nothing that follows."""
    import timm

    from pape_hub.checkpoint import save_checkpoint

    model = timm.create_model("vit_t4_pape", embed_dim=32, depth=1, num_heads=2, num_classes=3)
    state = torch.get_rng_state()
    save_checkpoint(model, tmp_path / "ck")
    assert torch.equal(state, torch.get_rng_state())
    loaded, _ = load_checkpoint(tmp_path / "ck")
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(loaded.eval()(x), model.eval()(x))


def test_saving_the_transformers_face_takes_given_labels_and_one_number_normalisation(tmp_path):
    import timm

    from pape_hub.checkpoint import read_config, save_checkpoint
    from pape_hub.hf.convert import timm_to_transformers

    hf = timm_to_transformers(timm.create_model("vit_t4_pape", embed_dim=32, depth=1, num_heads=2, num_classes=3),
                              ["a", "b", "c"])
    hf.config.image_mean, hf.config.image_std = 0.5, 0.25  # one number for every channel, as transformers allows
    save_checkpoint(hf, tmp_path / "ck", label_names=["x", "y", "z"])
    config = read_config(tmp_path / "ck")
    assert config["label_names"] == ["x", "y", "z"] and hf.config.id2label[0] == "a"  # the model is left as it is
    assert config["pretrained_cfg"]["mean"] == [0.5] * 3 and config["pretrained_cfg"]["std"] == [0.25] * 3


def test_report_to_is_trainers_name_for_log_with():
    import argparse

    from pape_hub.commands.train import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args(["--report-to", "tensorboard"])).log_with == "tensorboard"
    assert config_from_args(parser.parse_args(["--log-with", "wandb"])).log_with == "wandb"
    assert config_from_args(parser.parse_args([])).log_with is None
