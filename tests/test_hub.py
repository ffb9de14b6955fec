"""The real Hub code paths (huggingface_hub uploads, timm's ``hf-hub:`` and ``pretrained=True``, transformers'
``from_pretrained``) against the package's Hub endpoint on 127.0.0.1 (:mod:`lab.local_hub`). Clients run in
subprocesses because huggingface_hub reads HF_ENDPOINT at import time; Xet is disabled (the classic LFS path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import timm

from lab.local_hub import DropConnection, LocalHub
from pape_hub.checkpoint import save_checkpoint

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` (CI) runs them

ROOT = Path(__file__).resolve().parent.parent
TINY = '{"patch_size": 12, "embed_dim": 32, "depth": 2, "num_heads": 2, "global_pool": "avg", "class_token": false}'


@pytest.fixture
def hub(tmp_path):
    server = LocalHub(tmp_path / "hub-data").start()
    yield server
    server.stop()


def client_env(hub: LocalHub, tmp_path: Path, token: bool = True, **extra: str) -> dict[str, str]:
    """A client process's environment: the local Hub as its endpoint, its own HF_HOME."""
    env = {**os.environ, **hub.client_env(), "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_ETAG_TIMEOUT": "30",
           "HF_HUB_DOWNLOAD_TIMEOUT": "30", **extra}
    if "HF_HUB_OFFLINE" not in extra:
        env.pop("HF_HUB_OFFLINE", None)
    if not token:
        env.pop("HF_TOKEN")
    return env


def client(hub: LocalHub, tmp_path: Path, script: str, token: bool = True, **extra: str
           ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          env=client_env(hub, tmp_path, token, **extra), cwd=ROOT, timeout=600)


def tiny_checkpoint(folder: Path, encoding: str = "pape", seed: int = 0) -> Path:
    import torch

    torch.manual_seed(seed)
    model = timm.create_model(f"vit_t4_{encoding}", embed_dim=32, depth=2, num_heads=2, num_classes=3).eval()
    return save_checkpoint(model, folder, {"rows": [dict(size=32, interpolation=False, top1=0.5, top5=1.0,
                                                         loss=1.0, count=10)],
                                           "sweep_unit": "image size (px)", "split": "test", "trained_at": 32,
                                           "commit": "test"}, label_names=["a", "b", "c"])


# appended to the 8-space-indented client scripts below
LOAD_BACK = """
        import json, torch, timm, pape_hub
        from transformers import AutoModelForImageClassification
        local = timm.create_model("local-dir:{folder}", pretrained=True).eval()
        via_timm = timm.create_model("hf-hub:{repo}", pretrained=True).eval()
        via_hf = AutoModelForImageClassification.from_pretrained("{repo}").eval()
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            print(json.dumps([torch.equal(via_timm(x), local(x)), torch.equal(via_hf(x).logits, local(x))]))
"""


@pytest.mark.parametrize("upload_mode", ["auto", "regular"])
def test_push_then_load_from_both_faces_lfs_and_regular(hub, tmp_path, upload_mode):
    hub.upload_mode = upload_mode
    folder = tiny_checkpoint(tmp_path / "ckpt")
    done = client(hub, tmp_path, f"""
        from pape_hub_cli import main
        assert main(["push", "{folder}", "--repo-id", "org/tiny-pape"]) == 0
    """ + LOAD_BACK.format(folder=folder, repo="org/tiny-pape"))
    assert done.stdout.strip().endswith("[true, true]"), done.stderr[-3000:]
    assert "pushed" in done.stdout and f"{hub.url}/org/tiny-pape/commit/" in done.stdout
    files = hub.files("org/tiny-pape")
    assert {"model.safetensors", "config.json", "preprocessor_config.json", "README.md", "eval.json",
            "modeling_pape_vit.py"} <= set(files)
    assert files["model.safetensors"]["kind"] == ("lfs" if upload_mode == "auto" else "regular")
    assert files["config.json"]["kind"] == "regular"
    card = (hub.data_dir / "objects" / "regular" / files["README.md"]["oid"]).read_bytes().decode()
    assert "org/tiny-pape" in card and "REPO_ID" not in card and "library_name: transformers" in card
    # this checkpoint records no training data: the card lists none (it once claimed the arrow task by default)
    assert "import pape_hub" in card and "model-index" in card and "datasets:" not in card
    assert "/tmp" not in (hub.data_dir / "objects" / "regular" / files["config.json"]["oid"]).read_text()


def test_multipart_lfs_upload(hub, tmp_path):
    hub.multipart_threshold, hub.chunk_size = 1 << 16, 1 << 16  # the weights go up in 64 KiB parts
    folder = tiny_checkpoint(tmp_path / "ckpt")
    done = client(hub, tmp_path, f"""
        from pape_hub.hub import push_checkpoint
        push_checkpoint("{folder}", "org/multi")
    """ + LOAD_BACK.format(folder=folder, repo="org/multi"))
    assert done.stdout.strip().endswith("[true, true]"), done.stderr[-3000:]
    assert sum("/part/" in r for r in hub.requests) > 2


def test_repush_makes_a_new_commit_and_deletes_nothing_and_offline_cache_loads(hub, tmp_path):
    first = tiny_checkpoint(tmp_path / "v1", seed=0)
    (first / "extra_plot.png").write_bytes(b"\x89PNG fake")
    second = tiny_checkpoint(tmp_path / "v2", seed=1)
    done = client(hub, tmp_path, f"""
        from pape_hub.hub import push_checkpoint
        push_checkpoint("{first}", "org/evolving", include=["extra_plot.png"])
        push_checkpoint("{second}", "org/evolving")
        import json, torch, timm, pape_hub
        model = timm.create_model("hf-hub:org/evolving", pretrained=True)  # fills the cache
        print("filled")
    """)
    assert done.stdout.strip().endswith("filled"), done.stderr[-3000:]
    assert len(hub.history("org/evolving", None)) == 2
    assert "extra_plot.png" in hub.files("org/evolving")  # included by the first commit, kept by the second
    offline = client(hub, tmp_path, f"""
        import torch, timm, pape_hub
        from transformers import AutoModelForImageClassification
        local = timm.create_model("local-dir:{second}", pretrained=True).eval()
        cached = timm.create_model("hf-hub:org/evolving", pretrained=True).eval()
        x = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            print(torch.equal(cached(x), local(x)))
    """, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")  # nothing answers there
    assert offline.stdout.strip().endswith("True"), offline.stderr[-3000:]


def test_writes_need_the_token_and_private_repos_hide(hub, tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt")
    done = client(hub, tmp_path, f"""
        from pape_hub.hub import push_checkpoint
        try:
            push_checkpoint("{folder}", "org/nope")
        except PermissionError as err:
            print("refused:", err)
    """, token=False)
    assert "refused: pushing to org/nope needs a Hugging Face token" in done.stdout, done.stderr[-2000:]
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{hub.url}/api/repos/create", data=b'{"name": "x", "organization": "org"}',
                                     method="POST", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request)
    assert err.value.code == 401 and err.value.headers["X-Error-Code"] == "Unauthorized"
    assert not hub.repo_exists("org/x") and not hub.repo_exists("org/nope")
    hub.create_repo("org/secret", private=True)
    answers = []
    for repo in ("org/secret", "org/missing"):  # private and missing look alike to anonymous readers
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{hub.url}/api/models/{repo}")
        answers.append((err.value.code, err.value.headers["X-Error-Code"], json.loads(err.value.read())["error"]
                        .replace(repo, "REPO")))
    assert answers[0] == answers[1] and answers[0][:2] == (401, "RepoNotFound")


def drop_connection(*args, **kwargs):
    raise DropConnection


def test_interrupted_push_leaves_the_old_commit_and_a_retry_succeeds(hub, tmp_path, monkeypatch):
    """One client pushes four times, waiting between pushes while the test breaks the Hub or mends it: a first
    version; a second, its LFS upload dropped; the second, its commit dropped; the second again, then loaded back."""
    first, second = tiny_checkpoint(tmp_path / "v1", seed=0), tiny_checkpoint(tmp_path / "v2", seed=1)
    script = textwrap.dedent(f"""
        import huggingface_hub.utils._http as http
        http.time.sleep = lambda seconds: None  # its retries, without the back-off waits (about 23 s a push)
        from pape_hub.hub import push_checkpoint
        for folder in ("{first}", "{second}", "{second}"):
            try:
                push_checkpoint(folder, "org/safe")
                print("pushed", flush=True)
            except Exception as err:
                print("failed:", type(err).__name__, flush=True)
            input()  # the test breaks or mends the Hub for the next push
        push_checkpoint("{second}", "org/safe")
    """) + textwrap.dedent(LOAD_BACK.format(folder=second, repo="org/safe"))
    env = client_env(hub, tmp_path, HF_HUB_DOWNLOAD_TIMEOUT="5", HF_HUB_ETAG_TIMEOUT="5")
    with (tmp_path / "client.err").open("w+") as err, subprocess.Popen(
            [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
            env=env, cwd=ROOT) as process:
        said = [process.stdout.readline()]
        head = hub.head("org/safe")
        for step in ("receive_lfs", "commit"):  # dropped during the LFS upload, then during the commit
            monkeypatch.setattr(hub, step, drop_connection)  # huggingface_hub retries; every try fails
            process.stdin.write("\n")
            process.stdin.flush()
            said.append(process.stdout.readline())
            monkeypatch.undo()
            assert hub.head("org/safe") == head  # the old commit, whole
        process.stdin.write("\n")
        process.stdin.flush()
        said.append(process.stdout.read())
        process.wait(timeout=600)
        err.seek(0)
        assert said[0] == "pushed\n" and all(s.startswith("failed:") for s in said[1:3]), (said, err.read()[-3000:])
        assert said[3].strip().endswith("[true, true]"), (said, err.read()[-3000:])
    assert len(hub.history("org/safe", None)) == 2


def test_push_input_errors_are_named(hub, tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt")
    (tmp_path / "empty").mkdir()
    broken = tiny_checkpoint(tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    done = client(hub, tmp_path, f"""
        from pape_hub_cli import main
        main(["push", "{folder}", "--repo-id", "org/a/b"])
        main(["push", "{folder}", "--repo-id", "org/bad name"])
        main(["push", "{tmp_path / 'empty'}", "--repo-id", "org/x"])
        main(["push", "{broken}", "--repo-id", "org/x"])
    """)
    lines = done.stderr.strip().splitlines()
    assert "repo id 'org/a/b' is malformed: expected 'namespace/name'" in lines[0]
    assert "repo id 'org/bad name' is malformed" in lines[1]
    assert "is not a pape_hub checkpoint: config.json is missing" in lines[2]
    assert "model.safetensors is corrupt or not a safetensors file" in lines[3]
    assert not hub.repo_exists("org/x")


def test_training_checks_the_push_target_before_the_first_step(hub, tmp_path):
    """Without a token, training is refused before any work; with one, train -> evaluate -> card -> push, and the
    pushed model loads back from both faces. One client runs both, the token set between them as a user would."""
    done = client(hub, tmp_path, f"""
        import os
        from pape_hub_cli import main
        train = ["train", "--model", "vit_t4_pape", "--model-kwargs", {TINY!r}, "--epochs", "1",
                 "--train-size", "64", "--eval-size", "32", "--batch-size", "32", "--quiet",
                 "--output-dir", "{tmp_path / 'run'}", "--push-to-hub", "org/arrows-pape"]
        print("without a token: rc", main(train), "output dir", os.path.exists("{tmp_path / 'run'}"))
        os.environ["HF_TOKEN"] = {hub.token!r}
        assert main(train) == 0
    """ + LOAD_BACK.format(folder=tmp_path / "run" / "best", repo="org/arrows-pape").replace("3, 32, 32", "3, 48, 48"),
        token=False)
    assert "needs a Hugging Face token" in done.stderr, done.stderr[-3000:]
    assert "without a token: rc 1 output dir False" in done.stdout, done.stderr[-3000:]  # refused before any work
    assert done.stdout.strip().endswith("[true, true]"), done.stderr[-3000:]
    best = tmp_path / "run" / "best"  # train -> evaluate -> card -> push: the pushed card reports the evaluation
    card = (best / "README.md").read_text()
    assert (best / "eval.json").exists() and "No evaluation was run" not in card and "accuracy_vs_size.png" in card


def test_pretrained_true_resolves_published_weights_only(hub, tmp_path):
    import torch

    torch.manual_seed(0)
    model = timm.create_model("vit_t4_pape", embed_dim=32, depth=2, num_heads=2).eval()  # the table's args + tiny
    folder = save_checkpoint(model, tmp_path / "published")
    done = client(hub, tmp_path, f"""
        import torch, timm, pape_hub
        from pape_hub.hub import push_checkpoint
        push_checkpoint("{folder}", "pape-hub/vit_t4_pape")
        try:
            timm.create_model("vit_t4_rope", pretrained=True)
        except ValueError as err:
            print("unpublished:", err)
        pape_hub.register_published_weights("vit_t4_pape", "pape-hub/vit_t4_pape")
        assert timm.list_models("vit_t4_*", pretrained=True) == ["vit_t4_pape"]
        loaded = timm.create_model("vit_t4_pape", pretrained=True, embed_dim=32, depth=2, num_heads=2).eval()
        local = timm.create_model("local-dir:{folder}", pretrained=True).eval()
        x = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            print("identical", torch.equal(loaded(x), local(x)))
    """)
    assert "unpublished: vit_t4_rope has no weights (no tag of it has any" in done.stdout, done.stderr
    assert done.stdout.strip().endswith("identical True"), done.stderr[-3000:]


def test_hub_serve_command_prints_the_endpoint(tmp_path):
    """Within 2 s of starting: the endpoint imports neither torch nor pape_hub's models."""
    import time

    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "lab", "hub", "serve", "--port", "0", "--data-dir",
                             str(tmp_path / "data"), "--token", "hf_secret"], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        first = proc.stdout.readline()
        assert time.time() - started < 2.0
        assert first.startswith("local Hub serving") and "http://127.0.0.1:" in first
        url = first.split(" at ")[-1].strip()
        import urllib.request

        request = urllib.request.Request(f"{url}/api/whoami-v2", headers={"Authorization": "Bearer hf_secret"})
        assert json.loads(urllib.request.urlopen(request).read())["name"] == "local-user"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
