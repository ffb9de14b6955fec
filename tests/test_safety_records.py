"""Reports, records, cards and training state, attacked (issue: reliability round 2, Medium 13 and the Low items
on results files, card values, output paths, full disks, kills and corrupt resume state): each is one clear error
naming the file, field or flag, and nothing hand-written or saved is lost."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import timm
import torch
from test_training import arrow_config

from lab.commands.report import escape_markup, render
from pape_hub.checkpoint import save_checkpoint
from pape_hub.records import Evaluation, SweepRow, read_evaluation, read_record
from pape_hub.training import train

ROOT = Path(__file__).resolve().parent.parent


# --- README markers ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,message", [
    ("intro\n<!-- generated: encodings -->\nold table\n\nmy own notes\n", r"line 2: block 'encodings' has no end"),
    ("<!-- generated: encodings -->\nx\n<!-- generated: startup -->\ny\n<!-- end generated: startup -->\n",
     r"line 3: block 'startup' starts inside block 'encodings'"),
    ("notes\n<!-- end generated: encodings -->\n", r"line 2: an end marker of block 'encodings' without its start"),
    ("<!-- generated: encodings -->\n<!-- end generated: encodings -->\nmine\n<!-- generated: encodings -->\n"
     "x\n<!-- end generated: encodings -->\n", r"line 4: block 'encodings' appears twice"),
])
def test_unbalanced_markers_are_refused_by_line_and_nothing_is_rewritten(tmp_path, capsys, text, message):
    from lab.__main__ import LAB

    readme = tmp_path / "README.md"
    readme.write_text(text)
    assert LAB.main(["report", "--page", str(readme), "--results", str(ROOT / "results")]) == 1
    assert "README.md " in capsys.readouterr().err
    with pytest.raises(ValueError, match=message):
        render(text, ROOT / "results")
    assert readme.read_text() == text


def test_a_label_with_a_marker_or_html_is_escaped():
    hostile = "| `x<!-- end generated: encodings -->` | <script>alert(1)</script> | < 1 s |"
    assert escape_markup(hostile) == ("| `x&lt;!-- end generated: encodings -->` | &lt;script>alert(1)&lt;/script> "
                                      "| < 1 s |")


# --- results files ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("data,message", [
    ({"rows": [{"size": 4, "interpolation": False, "top1": "0.5", "top5": 1, "loss": 1, "count": 5}]},
     r"evaluation.rows\[0\].top1 must be int or float"),
    ({"rows": [{"size": 4, "interpolation": False, "top1": 57, "top5": 1, "loss": 1, "count": 5}]},
     r"evaluation.rows\[0\].top1 must be a number in \[0, 1\], got 57"),
    ({"rows": [{"size": 4, "interpolation": False, "top1": float("nan"), "top5": 1, "loss": 1, "count": 5}]},
     r"evaluation.rows\[0\].top1 must be a number in \[0, 1\], got nan"),
    ({"rows": [{"size": 4, "top1": 0.5, "top5": 1, "loss": 1, "count": 5}]},
     r"evaluation.rows\[0\].interpolation is missing"),
    ({"rows": "none"}, "evaluation.rows must be list"),
    ([1, 2], "evaluation must be a JSON object"),
])
def test_a_malformed_eval_json_names_the_file_and_field(tmp_path, data, message):
    (tmp_path / "eval.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"{tmp_path / 'eval.json'}: {message}"):
        read_evaluation(tmp_path)


def test_a_malformed_summary_or_comparison_json_names_the_file_and_field(tmp_path):
    from pape_hub.records import Comparison

    summary = json.loads((ROOT / "results" / "digits" / "summary.json").read_text())
    for key, value, message in [("sizes", "16,24", "summary.sizes must be list"),
                                ("seeds", [0, "1"], r"summary.seeds\[1\] must be int"),
                                ("runs", None, "summary.runs must be list")]:
        (tmp_path / "summary.json").write_text(json.dumps(dict(summary, **{key: value})))
        with pytest.raises(ValueError, match=f"summary.json: {message}"):
            read_record(tmp_path / "summary.json", Comparison.from_dict)
    (tmp_path / "eval.json").write_text(json.dumps({"rows": []}))
    (tmp_path / "comparison.json").write_text(json.dumps({"seeds": "0,1"}))
    with pytest.raises(ValueError, match="comparison.json: comparison context.seeds must be list"):
        read_evaluation(tmp_path)
    (tmp_path / "comparison.json").write_text("{not json")
    with pytest.raises(ValueError, match="comparison.json is not valid JSON"):
        read_evaluation(tmp_path)


def test_an_accuracy_outside_zero_to_one_is_no_record():
    with pytest.raises(ValueError, match="top1 must be a number in"):
        SweepRow(4, False, 57.0, 1.0, 0.5, 10)
    assert Evaluation([SweepRow(4, False, 0.25, 1.0, 1.4, 10)]).accuracy(4) == 0.25


# --- output paths -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command,name", [("eval", "config.json"), ("eval", "model.safetensors"),
                                          ("card", "config.json"), ("card", "preprocessor_config.json")])
def test_an_output_over_the_checkpoints_own_files_is_refused(tmp_path, capsys, command, name):
    from pape_hub_cli import main

    torch.manual_seed(0)
    folder = save_checkpoint(timm.create_model("vit_t4_pape", embed_dim=32, depth=1, num_heads=2, num_classes=4),
                             tmp_path / "ck", extra={"dataset": {"spec": "digits"}})
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    args = [command, str(folder), "--output", str(folder / name)] + (["--dataset", "digits"] if command == "eval"
                                                                      else [])
    assert main(args) == 1
    assert "is a file of the checkpoint folder" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# --- training state ---------------------------------------------------------------------------------------------
def test_a_full_disk_during_the_state_save_is_named_and_resume_keeps_one_line_per_epoch(tmp_path, monkeypatch):
    from accelerate import Accelerator

    save_state = Accelerator.save_state
    calls = {"n": 0}

    def full_disk(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return save_state(self, *args, **kwargs)

    monkeypatch.setattr(Accelerator, "save_state", full_disk)
    with pytest.raises(OSError, match=r"could not write the training state of epoch 2 .*No space left.*--resume"):
        train(arrow_config(tmp_path, epochs=3))
    monkeypatch.undo()
    train(arrow_config(tmp_path, epochs=3, resume=str(tmp_path / "run")))
    lines = [json.loads(line)["epoch"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines == [0, 1, 2]


def test_a_kill_right_after_a_metrics_line_repeats_no_epoch(tmp_path):
    train(arrow_config(tmp_path, epochs=3, stop_after_epoch=1))
    metrics = tmp_path / "run" / "metrics.jsonl"
    first = json.loads(metrics.read_text().splitlines()[0])
    metrics.write_text(metrics.read_text() + json.dumps(dict(first, epoch=1)) + "\n")  # epoch 2's line, no state
    train(arrow_config(tmp_path, epochs=3, resume=str(tmp_path / "run")))
    assert [json.loads(line)["epoch"] for line in metrics.read_text().splitlines()] == [0, 1, 2]


@pytest.mark.parametrize("name", ["random_states_0.pkl", "optimizer.bin", "model.safetensors"])
def test_a_truncated_state_file_is_named_instead_of_resuming_silently(tmp_path, name):
    train(arrow_config(tmp_path, epochs=2, stop_after_epoch=1))
    path = tmp_path / "run" / "state" / name
    path.write_bytes(path.read_bytes()[: os.path.getsize(path) // 2])
    with pytest.raises(ValueError, match=f"cannot resume: {path} is truncated or corrupt"):
        train(arrow_config(tmp_path, epochs=2, resume=str(tmp_path / "run")))
