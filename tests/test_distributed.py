"""Data-parallel training with accelerate on 2 CPU processes (gloo), launched as a user would:
``ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 -m pape_hub_cli train ...``. It shards the
data, writes one checkpoint set, only the main process prints the summary, it matches one process at the same global
batch, and a run stopped after epoch 1 and resumed ends at an uninterrupted run's weights, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` (CI) runs them

ROOT = Path(__file__).resolve().parent.parent
MODEL = '{"patch_size": 12, "embed_dim": 32, "depth": 2, "num_heads": 2, "global_pool": "avg", "class_token": false}'
COMMON = ["--model", "vit_t4_pape", "--model-kwargs", MODEL, "--epochs", "2", "--train-size", "128", "--eval-size",
          "64", "--seed", "1", "--drop-path", "0", "--label-smoothing", "0", "--threads", "1"]


def launch(out: Path, batch: int, *extra: str) -> subprocess.CompletedProcess:
    """``accelerate launch`` of two processes, as a user starts data-parallel training on CPUs."""
    accelerate = Path(sys.executable).parent / "accelerate"
    launcher = [str(accelerate), "launch", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--num_processes", "2", "--multi_gpu"]
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    done = subprocess.run([*launcher, "-m", "pape_hub_cli", "train", *COMMON, "--batch-size", str(batch),
                           "--output-dir", str(out), *extra], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def one_process(out: Path, batch: int) -> None:
    """The reference run: one process, this one, through the command's own entry point (a launch would only add the
    launcher's and a process's start)."""
    from pape_hub_cli import main

    assert main(["train", *COMMON, "--batch-size", str(batch), "--output-dir", str(out), "--quiet"]) == 0


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "last" / "model.safetensors"))


def test_two_processes_shard_match_one_process_and_resume_exactly(tmp_path):
    """Two processes stopped after epoch 1 and resumed end at the weights of two processes not stopped, bit for bit,
    and take the steps one process takes at the same global batch (a resume that lost a process's place in its shard,
    or its random state, would train on other samples: far more than the reduction order's 1e-5)."""
    launch(tmp_path / "whole", 16)
    launch(tmp_path / "two", 16, "--stop-after-epoch", "1")  # global batch 32
    resumed = launch(tmp_path / "two", 16, "--resume", str(tmp_path / "two"))
    one_process(tmp_path / "one", 32)
    assert resumed.stdout.count("best val top-1") == 1  # the summary, from the main process only
    history = json.loads((tmp_path / "two" / "results.json").read_text())["history"]
    assert len(history) == 2 and history[-1]["images_seen"] == 2 * 128
    assert sorted(p.name for p in (tmp_path / "two").iterdir() if not p.name.startswith(".")) == \
        ["best", "last", "metrics.jsonl", "results.json", "state", "training_curve.png"]
    assert len((tmp_path / "two" / "metrics.jsonl").read_text().splitlines()) == 2
    assert len(list((tmp_path / "two" / "state").glob("random_states_*.pkl"))) == 2  # one per process
    a, b, whole = weights(tmp_path / "two"), weights(tmp_path / "one"), weights(tmp_path / "whole")
    assert all(torch.equal(a[k], whole[k]) for k in a)  # resumed exactly
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)  # the same steps, reduced in another order
