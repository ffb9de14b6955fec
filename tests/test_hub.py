"""The real Hub code paths (huggingface_hub uploads, timm's ``hf-hub:``, transformers' ``from_pretrained``)
against a Hub endpoint on 127.0.0.1 (tests/local_hub.py). Each client runs in a subprocess because
huggingface_hub reads HF_ENDPOINT at import time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from local_hub import LocalHub

TINY = '{"patch_size": 12, "embed_dim": 32, "depth": 2, "num_heads": 2, "global_pool": "avg", "class_token": false}'


@pytest.fixture
def hub(tmp_path):
    server = LocalHub().start()
    yield server
    server.stop()


def run_client(hub: LocalHub, tmp_path: Path, script: str, token: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HOME=str(tmp_path / "hf_home"),
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_ETAG_TIMEOUT="30", HF_HUB_DOWNLOAD_TIMEOUT="30")
    env.pop("HF_HUB_OFFLINE", None)
    if token:
        env["HF_TOKEN"] = hub.token
    else:
        env.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).parent.parent, timeout=600)


def test_train_push_to_hub_then_load_from_both_faces(hub, tmp_path):
    done = run_client(hub, tmp_path, f"""
        import json, torch, timm
        from pape_hub.cli import main
        assert main(["train", "--model", "vit_t4_pape", "--model-kwargs", {TINY!r}, "--epochs", "1",
                     "--train-size", "64", "--eval-size", "32", "--batch-size", "32", "--quiet",
                     "--output-dir", {str(tmp_path / "run")!r}, "--push-to-hub", "org/arrows-pape"]) == 0
        local = timm.create_model("local-dir:{tmp_path / 'run' / 'best'}", pretrained=True).eval()
        hub_model = timm.create_model("hf-hub:org/arrows-pape", pretrained=True).eval()
        x = torch.randn(2, 3, 48, 48)
        with torch.no_grad():
            assert torch.equal(local(x), hub_model(x))
        print("ok", hub_model.pos_encoding.name)
    """)
    assert done.stdout.strip().endswith("ok pape"), done.stderr[-3000:]
    repo = hub.repos["org/arrows-pape"]
    assert {"config.json", "model.safetensors"} <= set(repo["files"])


def test_transformers_push_and_load_by_repo_id_from_both_faces(hub, tmp_path):
    done = run_client(hub, tmp_path, """
        import torch, timm, pape_hub
        from transformers import AutoModelForImageClassification
        from pape_hub.hf import timm_to_transformers
        model = timm.create_model("vit_t4_rope_mixed", embed_dim=32, depth=2, num_heads=2, num_classes=3).eval()
        timm_to_transformers(model, ["a", "b", "c"]).push_to_hub("org/rm-tiny")
        x = torch.randn(2, 3, 32, 32)
        hf = AutoModelForImageClassification.from_pretrained("org/rm-tiny").eval()
        via_timm = timm.create_model("hf-hub:org/rm-tiny", pretrained=True).eval()
        with torch.no_grad():
            assert torch.equal(hf(x).logits, model(x)) and torch.equal(via_timm(x), model(x))
        print("ok")
    """)
    assert done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    assert "modeling_pape_vit.py" in hub.repos["org/rm-tiny"]["files"]


def test_push_without_token_is_refused(hub, tmp_path):
    done = run_client(hub, tmp_path, """
        from pape_hub.hub import push_checkpoint
        try:
            push_checkpoint(".", "org/nope")
        except Exception as err:
            print("refused", type(err).__name__)
    """, token=False)
    assert "refused" in done.stdout, done.stderr[-2000:]
    assert "org/nope" not in hub.repos
