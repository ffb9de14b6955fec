"""The first ten minutes (issue: defaults that finish, a start line and progress in every log, errors that name the
extra to install, a licence): what a new user sees from the commands, checked the way they would see it."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import timm

ROOT = Path(__file__).resolve().parent.parent
BLOCK = '''
import importlib.abc, importlib.util, sys
BLOCK = {blocked}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCK:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Blocker())
find = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in BLOCK else find(name, *a)
'''


def test_the_default_model_is_the_arrow_tasks_and_records_its_real_size():
    from pape_hub.models import model_args_for
    from pape_hub.training import TrainConfig

    cfg = TrainConfig()
    assert cfg.model == "vit_m12_rope_mixed" and cfg.dataset == "arrows"
    assert model_args_for(cfg.model) == dict(img_size=48, num_classes=4, position_encoding="rope_mixed", embed_dim=96,
                                             depth=4, num_heads=4, global_pool="avg", class_token=False, patch_size=12)
    assert sum(p.numel() for p in timm.create_model(cfg.model).parameters()) < 10**6


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_train_says_what_it_does_at_once_and_reports_progress_in_a_log(tmp_path):
    """stdout and stderr to a file (no terminal): a start line within 2 s, the model and data line, plain
    progress lines inside the epoch (every 30 s; 0.05 s here) and an epoch line with its time and what is left."""
    log = tmp_path / "train.log"
    started = time.time()
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "pape_hub_cli", "train", "--train-size", "1024",
                                    "--eval-size", "64", "--epochs", "2", "--batch-size", "64", "--output-dir",
                                    str(tmp_path / "run")], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=dict(os.environ, PAPE_HUB_PROGRESS_INTERVAL="0.05"))
        first_seen = None
        while process.poll() is None and first_seen is None:
            if log.read_text():
                first_seen = time.time() - started
            time.sleep(0.05)
        assert process.wait(600) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert first_seen is not None and first_seen < 2.0, first_seen
    assert "\r" not in text
    assert "training vit_m12_rope_mixed on arrows for 2 epochs into" in text and "M parameters; 1,024 training" in text
    assert "  epoch 1/2: " in text and " batch, loss " in text and " left" in text  # a line from inside the epoch
    assert "epoch 1/2: train loss" in text and "this epoch" in text and "elapsed, " in text


@pytest.mark.parametrize("blocked,call,extra", [
    ('{"accelerate"}', "import pape_hub_cli; sys.exit(pape_hub_cli.main(['train', '--epochs', '1']))", "train"),
    ('{"transformers"}', "import pape_hub; pape_hub.hf.timm_to_transformers", "hf"),
])
def test_a_missing_optional_dependency_names_the_extra(blocked, call, extra):
    done = subprocess.run([sys.executable, "-c", BLOCK.format(blocked=blocked) + call], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode != 0
    assert f"comes with pape_hub's '{extra}' extra: pip install 'pape_hub[{extra}]'" in done.stderr, done.stderr[-1500:]


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_eval_sweeps_the_task_sizes_by_default_without_a_useless_top5(tmp_path):
    from test_training import arrow_config

    from pape_hub.training import train

    train(arrow_config(tmp_path, epochs=1))
    done = subprocess.run([sys.executable, "-m", "pape_hub_cli", "eval", str(tmp_path / "run"), "--eval-size", "64"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    header = next(line for line in done.stdout.splitlines() if line.split()[:1] == ["size"])
    assert "top-5" not in header  # 4 classes: top-5 is always 1
    sizes = {line.split()[0] for line in done.stdout.splitlines() if line.strip()[:1].isdigit()}
    assert sizes == {"4", "6", "8"}
    assert "within chance's 95% interval" in done.stdout  # one epoch of 128 images learns nothing


def test_one_series_is_drawn_centred(tmp_path, monkeypatch):
    import matplotlib.axes

    from pape_hub.evaluation import plot_sweep_summary
    from pape_hub.records import Evaluation, SweepRow

    drawn = []
    original = matplotlib.axes.Axes.errorbar
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar",
                        lambda self, xs, *a, **k: drawn.append(list(xs)) or original(self, xs, *a, **k))
    plot_sweep_summary([Evaluation([SweepRow(4, False, 0.9, 1.0, 0.1, 10)], label="pape", trained_at=4)],
                       tmp_path / "plot.png")
    assert drawn == [[4]]


def test_the_licence_is_in_the_repository_and_declared(tmp_path):
    import tomllib

    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_stopping_a_comparison_says_what_is_kept_and_resume_keeps_it(tmp_path):
    command = [sys.executable, "-m", "lab", "arrows", "--encodings", "none,ape", "--seeds", "0",
               "--epochs", "1", "--train-size", "128", "--eval-size", "16", "--hub", "none", "--results-dir", "none",
               "--output-dir", str(tmp_path / "runs"), "--jobs", "1"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = ""
    deadline = time.time() + 300
    while "none seed 0:" not in out and time.time() < deadline:  # the first run is complete, the second started
        if select.select([process.stdout], [], [], 1.0)[0]:
            out += process.stdout.readline()
    process.terminate()
    rest, err = process.communicate(timeout=120)
    assert "stopped: 1 of 2 runs complete" in out + rest and "--resume" in out + rest, (out + rest, err[-2000:])
    assert "leaked" not in err and "Traceback" not in err, err[-2000:]
    again = subprocess.run(command + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "reusing the complete run" in (tmp_path / "runs" / "none_seed0.log").read_text()


def test_the_wheel_holds_the_library_and_not_the_lab(tmp_path):
    """`pip wheel .` shows the line between library and lab: the package, its command, the card templates and the
    licence; no README writer, speed targets, comparison runner, behaviour probes or Hub endpoint."""
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("pape_hub-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"pape_hub", "pape_hub_cli.py", wheel.name.split("-py3")[0] + ".dist-info"}, tops
    assert {"pape_hub/templates/model_card.md", "pape_hub/templates/conversion_card.md",
            "pape_hub/training/loop.py", "pape_hub/models/pretrained.py"} <= set(names)
    assert any(name.endswith("licenses/LICENSE") for name in names)
    lab_like = [n for n in names if any(word in n for word in ("report", "bench", "profile", "experiment",
                                                               "provenance", "server", "local_hub", "commands/zoo"))]
    assert not lab_like, lab_like
