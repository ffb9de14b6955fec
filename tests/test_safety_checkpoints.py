"""Checkpoint writers and loaders, attacked: a save never deletes what it did not write, concurrent saves never mix
two models, and loaders agree on which copy they load. (Issue: reliability round 2, High and Medium 1-2.)"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file

from pape_hub.checkpoint import MANIFEST, load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(embed_dim=32, depth=2, num_heads=2)


def tiny(seed: int = 0, encoding: str = "pape") -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(f"vit_t4_{encoding}", num_classes=3, **TINY)


def users_folder(root: Path) -> Path:
    """A folder holding a user's work: a file and a sub-folder."""
    folder = root / "v"
    (folder / "data").mkdir(parents=True)
    (folder / "t.txt").write_text("thesis")
    (folder / "data" / "x.bin").write_bytes(b"\0" * 10)
    return folder


def test_save_refuses_a_folder_it_did_not_write_and_deletes_nothing(tmp_path):
    folder = users_folder(tmp_path)
    with pytest.raises(FileExistsError, match=r"not a checkpoint pape_hub wrote: it holds data/, t\.txt.*overwrite"):
        save_checkpoint(tiny(), folder)
    assert (folder / "t.txt").read_text() == "thesis" and (folder / "data" / "x.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v"]  # no temporary folder left either


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_the_convert_command_refuses_it_too_before_downloading(tmp_path):
    folder = users_folder(tmp_path)
    done = subprocess.run([sys.executable, "-m", "pape_hub_cli", "convert", "vit_s16_ape.fb_deit3_in1k", str(folder)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert done.returncode == 1 and "not a checkpoint pape_hub wrote" in done.stderr, done.stderr
    assert (folder / "t.txt").read_text() == "thesis" and (folder / "data" / "x.bin").exists()


def test_overwrite_writes_into_the_folder_and_keeps_the_users_files(tmp_path):
    folder = users_folder(tmp_path)
    save_checkpoint(tiny(0), folder, overwrite=True)
    save_checkpoint(tiny(1), folder, results={"rows": []}, overwrite=True)
    save_checkpoint(tiny(2), folder, overwrite=True)  # the earlier save's eval.json is its own: removed
    assert (folder / "t.txt").read_text() == "thesis" and (folder / "data" / "x.bin").exists()
    assert not (folder / "eval.json").exists()
    model, _ = load_checkpoint(folder)
    assert torch.equal(model.state_dict()["head.weight"], tiny(2).state_dict()["head.weight"])


def test_overwrite_never_replaces_a_users_file_of_a_checkpoint_name(tmp_path):
    folder = tmp_path / "v"
    folder.mkdir()
    (folder / "config.json").write_text('{"mine": true}')
    with pytest.raises(FileExistsError, match="holds config.json, which pape_hub did not write"):
        save_checkpoint(tiny(), folder, overwrite=True)
    assert json.loads((folder / "config.json").read_text()) == {"mine": True}
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]


def test_a_checkpoint_pape_hub_wrote_is_replaced_whole_with_its_evaluation_and_card(tmp_path):
    from pape_hub.card import card_from_folder
    from pape_hub.records import Evaluation, SweepRow

    folder = save_checkpoint(tiny(0), tmp_path / "ck")
    save_checkpoint(tiny(1), folder, results=Evaluation([SweepRow(32, False, 0.5, 1.0, 1.0, 8)], dataset="digits"))
    card_from_folder(folder)  # a writer after the save: its file joins the manifest
    assert "README.md" in json.loads((folder / MANIFEST).read_text())["files"]
    save_checkpoint(tiny(2), folder)  # replaced whole: no stale evaluation or card of other weights
    assert sorted(p.name for p in folder.iterdir() if p.suffix != ".py") == [
        MANIFEST, "config.json", "model.safetensors", "preprocessor_config.json"]


def test_a_user_file_added_to_a_checkpoint_is_not_deleted_by_the_next_save(tmp_path):
    folder = save_checkpoint(tiny(0), tmp_path / "ck")
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes.txt"):
        save_checkpoint(tiny(1), folder)
    assert (folder / "notes.txt").read_text() == "mine"


def test_a_folder_saved_before_manifests_existed_is_still_a_checkpoint(tmp_path):
    folder = save_checkpoint(tiny(0), tmp_path / "ck")
    (folder / MANIFEST).unlink()  # as an earlier version of pape_hub left it
    save_checkpoint(tiny(1), folder)
    assert (folder / MANIFEST).exists()


@pytest.mark.parametrize("target", ["notes.txt", "", ".", "/"])
def test_a_file_or_a_path_that_names_no_folder_is_refused(tmp_path, monkeypatch, target):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises((NotADirectoryError, ValueError), match="is a file, not a checkpoint|names no checkpoint"):
        save_checkpoint(tiny(), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # not hidden as .notes.txt.old
    assert (tmp_path / "notes.txt").read_text() == "mine"


def _save_one(folder: str, seed: int) -> None:
    torch.set_num_threads(1)
    save_checkpoint(tiny(seed), folder, label_names=[f"seed{seed}"] * 3)


def test_concurrent_saves_leave_one_whole_model(tmp_path):
    folder = tmp_path / "ck"
    context = multiprocessing.get_context("fork")  # already imported: cheap to start, still separate processes
    for _ in range(6):  # a race, so several rounds: without the lock, most rounds mixed two saves
        workers = [context.Process(target=_save_one, args=(str(folder), seed)) for seed in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert all(w.exitcode == 0 for w in workers)
        config = json.loads((folder / "config.json").read_text())
        seed = int(config["label_names"][0].removeprefix("seed"))
        state = load_file(str(folder / "model.safetensors"))
        expected = tiny(seed).state_dict()
        assert all(torch.equal(state[f"vit.{k}"], v) for k, v in expected.items()), "weights of another save"
        assert not list(tmp_path.glob(".ck.tmp*")) and not list(tmp_path.glob(".ck.new"))


def test_loaders_agree_on_the_copy_after_an_interrupted_save(tmp_path):
    """A kill after the new copy was complete but before it was moved in leaves .ck.new beside ck: timm's
    local-dir: and load_checkpoint load the same model (ck), and both say what happened."""
    folder = save_checkpoint(tiny(0), tmp_path / "ck")
    newer = save_checkpoint(tiny(1), tmp_path / "other")
    os.replace(newer, tmp_path / ".ck.new")
    with pytest.warns(RuntimeWarning, match="interrupted save left a newer complete copy"):
        ours, _ = load_checkpoint(folder)
    with pytest.warns(RuntimeWarning, match="interrupted save left a newer complete copy"):
        theirs = timm.create_model(f"local-dir:{folder}", pretrained=True)
    assert torch.equal(ours.state_dict()["head.weight"], theirs.state_dict()["head.weight"])
