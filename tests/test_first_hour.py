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
