"""The commands a user runs on point clouds and event streams, driven as they are run: ``pape-hub train`` (generated
tasks and files in ModelNet's and the common event layouts), ``eval``, ``card``, ``push`` to the local Hub, and timm
loading the pushed repo by its id in a fresh process, with the same logits as the local folder."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from test_hub import client, hub  # noqa: F401 - the local Hub fixture
from test_modality_data import CUBE_F, CUBE_V, write_events, write_off

import pape_hub
from pape_hub.data.event_streams import MovingDotDataset
from pape_hub.evaluation import evaluate_checkpoint
from pape_hub.training import TrainConfig, train
from pape_hub_cli import main

POINTS = '{"num_groups": 8, "group_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2}'
EVENTS = ('{"sensor_size": [32, 32], "event_patch_size": 8, "threshold": 8, "time_scale": 25000, '
          '"nominal_duration": 100000, "embed_dim": 32, "depth": 1, "num_heads": 2}')


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_train_eval_card_push_and_load_a_point_model_by_hub_id(hub, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    common = ["--train-size", "64", "--eval-size", "32", "--batch-size", "16", "--quiet"]
    assert main(["train", "--model", "pointvit_m_pape_ri", "--dataset", "shapes3d", "--epochs", "1",
                 "--model-kwargs", POINTS, "--shapes-points", "128", "--shapes-min-points", "64",
                 "--output-dir", str(run), *common]) == 0
    assert main(["eval", str(run), "--dataset", "shapes3d", "--eval-size", "16", "--sizes", "64,128"]) == 0
    evaluation = json.loads((run / "best" / "eval.json").read_text())
    assert [r["size"] for r in evaluation["rows"]] == ["64", "64 rotated", "128", "128 rotated"]
    assert evaluation["trained_at"] == "128"
    assert main(["card", str(run / "best")]) == 0
    card = ModelCard.load(run / "best" / "README.md")  # huggingface_hub's own parser
    assert card.data.pipeline_tag is None and card.data.eval_results[0].task_type == "point-cloud-classification"
    assert "model(x, valid)" in card.text and "AutoModelForSequenceClassification" in card.text
    env = hub.client_env()
    inputs = """
        import torch
        x = torch.randn(2, 100, 3, generator=torch.Generator().manual_seed(0))
        valid = torch.ones(2, 100, dtype=torch.bool)
        valid[1, 60:] = False
    """
    loaded = client(hub, tmp_path, f"""
        from pape_hub_cli import main
        assert main(["push", "{run / 'best'}", "--repo-id", "org/points-pape-ri"]) == 0
    """ + inputs + f"""
        import json, timm, pape_hub
        from transformers import AutoModelForSequenceClassification
        local = timm.create_model("local-dir:{run / 'best'}", pretrained=True).eval()
        remote = timm.create_model("hf-hub:org/points-pape-ri", pretrained=True).eval()
        face = AutoModelForSequenceClassification.from_pretrained("org/points-pape-ri").eval()
        with torch.no_grad():
            reference = local(x, valid)
            print(json.dumps([torch.equal(remote(x, valid), reference),
                              torch.equal(face(points=x, attention_mask=valid.long()).logits, reference),
                              remote.num_classes, remote.pretrained_cfg["label_names"][:2], reference.tolist()]))
    """)  # pushed and loaded back in one client process, as tests/test_hub.py's round trips
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    same_timm, same_face, classes, labels, reference = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert [same_timm, same_face, classes, labels] == [True, True, 8, ["sphere", "cube"]]
    remote_code = client(hub, tmp_path, 'import sys\nsys.modules["pape_hub"] = None\n' + textwrap.dedent(inputs) + """
import json
from transformers import AutoModelForSequenceClassification
model = AutoModelForSequenceClassification.from_pretrained("org/points-pape-ri", trust_remote_code=True).eval()
with torch.no_grad():
    print(json.dumps([type(model).__name__, model(points=x, attention_mask=valid.long()).logits.tolist()]))
""")
    assert remote_code.returncode == 0, remote_code.stderr[-2000:]
    name, logits = json.loads(remote_code.stdout.strip().splitlines()[-1])
    assert name == "PapePointViTForClassification" and logits == reference  # without pape_hub: the same numbers
    # the code is the entry files and one module of pape_hub's: transformers warns per file that imports others
    assert remote_code.stderr.count("double-check they do not contain any added malicious code") <= 4
    assert env  # the clients ran against the local endpoint


def test_an_event_model_trains_resumes_and_is_swept_over_speeds(tmp_path):
    cfg = dict(model="eventvit_m_pape", dataset="movingdot", epochs=2, batch_size=16, train_size=48, eval_size=16,
               model_kwargs=json.loads(EVENTS), quiet=True, events=dict(steps=24))
    train(TrainConfig(**cfg, output_dir=str(tmp_path / "run"), stop_after_epoch=1))
    result = train(TrainConfig(**cfg, output_dir=str(tmp_path / "run"), resume=str(tmp_path / "run")))
    assert [h["epoch"] for h in result["history"]] == [0, 1]
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(tmp_path / "run" / "best")  # the transformers face, from the same folder
    batch, _ = pape_hub.data.point_clouds.pad_collate([MovingDotDataset(2)[i] for i in range(2)])
    assert backbone(events=batch["x"], attention_mask=batch["valid"]).pooler_output.shape == (2, 32)
    evaluation = evaluate_checkpoint(tmp_path / "run" / "best", "movingdot", eval_size=16, progress=False)
    assert [r.size for r in evaluation.rows] == ["speed 0.5", "speed 1", "speed 2", "speed 1, half the events"]
    assert evaluation.trained_at == "speed 1"


def test_modelnet_meshes_train_with_one_command(tmp_path):
    for cls in ("chair", "table", "lamp"):
        for split, count in (("train", 6), ("test", 2)):
            for i in range(count):
                vertices = np.asarray(CUBE_V, dtype=float) * (1 + 0.1 * i) * ([1, 1, 2] if cls == "lamp" else 1)
                write_off(tmp_path / "ModelNet" / cls / split / f"{cls}_{i:04d}.off", vertices, CUBE_F)
    result = train(TrainConfig(model="pointvit_m_alibi", dataset=f"modelnet:{tmp_path / 'ModelNet'}", epochs=1,
                               batch_size=6, num_points=64, model_kwargs=json.loads(POINTS),
                               output_dir=str(tmp_path / "run"), quiet=True))
    assert result["test"]["count"] == 6
    model, config = pape_hub.load_checkpoint(tmp_path / "run" / "best")
    assert config["label_names"] == ["chair", "lamp", "table"] and config["pape_hub"]["dataset"]["num_points"] == 64
    evaluation = evaluate_checkpoint(tmp_path / "run" / "best", f"modelnet:{tmp_path / 'ModelNet'}", progress=False)
    assert [r.size for r in evaluation.rows] == ["test"] and evaluation.rows[0].count == 6


def test_event_files_train_with_one_command(tmp_path):
    data = MovingDotDataset(24)
    for i in range(24):
        events, label = data.sample(i)
        write_events(tmp_path / "events" / data.classes[label] / f"s{i:02d}", events, "h5")
    result = train(TrainConfig(model="eventvit_m_rope", dataset=f"eventfolder:{tmp_path / 'events'}", epochs=1,
                               batch_size=8, val_fraction=0.25, model_kwargs=json.loads(EVENTS),
                               output_dir=str(tmp_path / "run"), quiet=True))
    assert result["best_val_top1"] >= 0 and "test" not in result  # no test split: none is claimed


@pytest.mark.parametrize(("model", "dataset", "message"), [
    ("vit_m12_pape", "shapes3d", "holds point clouds: train a pointvit_\\* model"),
    ("pointvit_m_pape", "movingdot", "holds event streams: train a eventvit_\\* model"),
])
def test_a_model_of_the_other_kind_is_refused_by_name(tmp_path, model, dataset, message):
    with pytest.raises(ValueError, match=message):
        train(TrainConfig(model=model, dataset=dataset, epochs=1, output_dir=str(tmp_path / "run"), quiet=True))


def test_padded_events_batch_like_points():
    batch, labels = pape_hub.data.point_clouds.pad_collate([MovingDotDataset(2)[i] for i in range(2)])
    assert batch["x"].dtype == torch.float32 and labels.tolist() == [MovingDotDataset(2)[i][1] for i in range(2)]
