"""The mission's paths driven by clients nobody here wrote (issue: real clients): transformers' own fine-tuning
example, a Hub repo loaded by id where pape_hub cannot be imported, timm's scripts' way of loading models,
AutoBackbone under a host dense-task head, and accelerate's launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from test_hub import client, hub  # noqa: F401 - the local Hub fixture

import pape_hub  # noqa: F401 - registers the models
from pape_hub.checkpoint import save_checkpoint

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` (CI) runs them

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(embed_dim=32, depth=2, num_heads=2)
#: a process where pape_hub cannot be imported (as on a machine that only has transformers)
WITHOUT_PAPE_HUB = 'import sys\nsys.modules["pape_hub"] = None\n'


def image_classes(root: Path, classes: tuple[str, ...] = ("cat", "dog", "fox"), per_class: int = 4) -> Path:
    rng = np.random.default_rng(0)
    for label in classes:
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(root / label / f"{label}{i}.png")
    return root


def pretrained(folder: Path, encoding: str = "pape") -> Path:
    torch.manual_seed(0)
    return save_checkpoint(timm.create_model(f"vit_t4_{encoding}", num_classes=5, **TINY).eval(), folder)


# --- 1. transformers' image-classification example ----------------------------------------------------------------
EXAMPLE = """
import json, os, sys, torch
{prelude}
from datasets import load_dataset
from transformers import (AutoConfig, AutoImageProcessor, AutoModelForImageClassification, Trainer,
                          TrainingArguments)

# what transformers' examples/pytorch/image-classification/run_image_classification.py does, step by step
dataset = load_dataset("imagefolder", data_files={{"train": os.path.join({data!r}, "**")}})
split = dataset["train"].train_test_split(0.25, seed=0)
dataset["train"], dataset["validation"] = split["train"], split["test"]
labels = dataset["train"].features["label"].names
label2id, id2label = {{}}, {{}}
for i, label in enumerate(labels):
    label2id[label] = str(i)  # string ids, as the example builds them
    id2label[str(i)] = label
config = AutoConfig.from_pretrained({model!r}, num_labels=len(labels), label2id=label2id, id2label=id2label,
                                    finetuning_task="image-classification", trust_remote_code=True)
model = AutoModelForImageClassification.from_pretrained({model!r}, config=config, ignore_mismatched_sizes=True,
                                                        trust_remote_code=True)
processor = AutoImageProcessor.from_pretrained({model!r}, trust_remote_code=True)
# as transformers' run_image_classification.py reads it
size = processor.size["shortest_edge"] if "shortest_edge" in processor.size else processor.size["height"]

def transform(batch):
    pixels = processor([image.convert("RGB") for image in batch["image"]], return_tensors="pt")["pixel_values"]
    return {{"pixel_values": pixels, "labels": batch["label"]}}

dataset["train"].set_transform(transform)
dataset["validation"].set_transform(transform)

def collate(examples):
    return {{"pixel_values": torch.stack([e["pixel_values"] for e in examples]),
             "labels": torch.tensor([e["labels"] for e in examples])}}

args = TrainingArguments(output_dir={out!r}, num_train_epochs=1, per_device_train_batch_size=4,
                         remove_unused_columns=False, report_to=[], use_cpu=True, save_strategy="no")
trainer = Trainer(model=model, args=args, train_dataset=dataset["train"], eval_dataset=dataset["validation"],
                  processing_class=processor, data_collator=collate)
result = trainer.train()
trainer.save_model()
trainer.log_metrics("train", result.metrics)
trainer.save_metrics("train", result.metrics)
trainer.save_state()
metrics = trainer.evaluate()
trainer.save_metrics("eval", metrics)
trainer.create_model_card(finetuned_from={model!r}, tasks="image-classification", tags=["image-classification"])
print(json.dumps(sorted(os.listdir({out!r}))))
"""


@pytest.mark.parametrize("with_pape_hub", [True, False])
def test_transformers_example_fine_tunes_and_saves_with_string_label_ids(tmp_path, with_pape_hub):
    data = image_classes(tmp_path / "data")
    model = pretrained(tmp_path / "pretrained")
    out = tmp_path / "finetuned"
    script = EXAMPLE.format(prelude="import pape_hub" if with_pape_hub else WITHOUT_PAPE_HUB, data=str(data),
                            model=str(model), out=str(out))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_DATASETS_OFFLINE="1"),
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "train_results.json",
            "eval_results.json", "README.md"} <= set(eval(done.stdout.strip().splitlines()[-1]))  # noqa: S307
    reloaded, config = pape_hub.load_checkpoint(out)  # and back through both faces, with the labels
    assert config["label_names"] == ["cat", "dog", "fox"] and reloaded.num_classes == 3
    from transformers import pipeline

    top = pipeline("image-classification", model=str(out))(Image.new("RGB", (32, 32)))[0]
    assert top["label"] in ("cat", "dog", "fox")


# --- 2. a Hub repo used where pape_hub cannot be imported ------------------------------------------------------------
def write_clip(path: Path, frames: int = 4, size: int = 32) -> Path:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((size, size, 3), 40 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def test_a_hub_repo_runs_where_pape_hub_is_not_installed(hub, tmp_path):  # noqa: F811 - the fixture
    torch.manual_seed(0)
    image = save_checkpoint(timm.create_model("vit_t4_rope_mixed", num_classes=3, **TINY).eval(), tmp_path / "image",
                            label_names=["a", "b", "c"])
    video = save_checkpoint(timm.create_model("vivit_t16_rope", num_classes=2, img_size=32, num_frames=4,
                                              **TINY).eval(), tmp_path / "video", label_names=["jump", "walk"])
    clip = write_clip(tmp_path / "clip.mp4")
    pushed = client(hub, tmp_path, f"""
        from pape_hub.hub import push_checkpoint
        push_checkpoint("{image}", "org/image")
        push_checkpoint("{video}", "org/video")
    """)
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    done = client(hub, tmp_path, WITHOUT_PAPE_HUB + f"""
import builtins, torch
from PIL import Image
def no_prompt(*args):
    raise AssertionError(f"transformers asked: {{args}}")
builtins.input = no_prompt
from transformers import (AutoBackbone, AutoImageProcessor, AutoModelForImageClassification,
                          AutoModelForVideoClassification, AutoVideoProcessor, pipeline)
model = AutoModelForImageClassification.from_pretrained("org/image", trust_remote_code=True)
processor = AutoImageProcessor.from_pretrained("org/image", trust_remote_code=True)
top = pipeline("image-classification", model="org/image", trust_remote_code=True)(Image.new("RGB", (48, 40)))
maps = AutoBackbone.from_pretrained("org/image", trust_remote_code=True, out_indices=[1, 2])(
    torch.randn(1, 3, 32, 32)).feature_maps
video = AutoModelForVideoClassification.from_pretrained("org/video", trust_remote_code=True)
frames = AutoVideoProcessor.from_pretrained("org/video", trust_remote_code=True)
label = pipeline("video-classification", model="org/video", trust_remote_code=True)({str(clip)!r})[0]["label"]
print("|".join(map(str, [type(processor).__name__, processor.crop_size["height"], top[0]["label"],
                          [tuple(m.shape) for m in maps], type(frames).__name__, label])))
""")
    assert done.returncode == 0, done.stderr[-3000:]
    fields = done.stdout.strip().splitlines()[-1].split("|")
    assert fields[:2] == ["BitImageProcessor", "32"] and fields[2] in ("a", "b", "c"), done.stdout[-500:]
    assert fields[3:5] == ["[(1, 32, 8, 8), (1, 32, 8, 8)]", "PapeViViTVideoProcessor"] and fields[5] in ("jump",
                                                                                                           "walk")


# --- 3. timm's scripts --------------------------------------------------------------------------------------------
#: how timm's train.py / validate.py build a model, written out: modules named by --device-modules imported by name,
#: then create_model (with --pretrained-path as a file overlay that adapts the head), load_checkpoint for
#: --initial-checkpoint / --checkpoint, and the forward under --amp --amp-dtype bfloat16
TIMM_SCRIPT = """
import argparse, ast, importlib, torch
from timm.models import create_model, load_checkpoint
parser = argparse.ArgumentParser()
parser.add_argument("--model")
parser.add_argument("--model-kwargs", nargs="*", default=[])
parser.add_argument("--num-classes", type=int)
parser.add_argument("--pretrained-path")
parser.add_argument("--initial-checkpoint")
parser.add_argument("--device-modules", nargs="+")
args = parser.parse_args()
for module in args.device_modules or []:
    importlib.import_module(module)
factory = dict(pretrained_cfg_overlay=dict(file=args.pretrained_path, num_classes=-1)) if args.pretrained_path else {}
kwargs = {k: ast.literal_eval(v) for k, v in (item.split("=", 1) for item in args.model_kwargs)}
model = create_model(args.model, pretrained=bool(args.pretrained_path), num_classes=args.num_classes, **factory,
                     **kwargs)
if args.initial_checkpoint:
    load_checkpoint(model, args.initial_checkpoint)
with torch.autocast("cpu", dtype=torch.bfloat16):
    print(tuple(model.eval()(torch.randn(2, 3, 32, 32)).shape))
"""


def test_timm_scripts_load_the_models_through_the_runner_or_device_modules(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TIMM_SCRIPT)
    weights = pretrained(tmp_path / "ck") / "model.safetensors"  # a pape_hub checkpoint file (vit. keys)
    torch.save(timm.create_model("vit_t4_pape", num_classes=2, **TINY).state_dict(), tmp_path / "timm.pth")
    common = ["--model", "vit_t4_pape", "--num-classes", "2", "--model-kwargs", "embed_dim=32", "depth=2",
              "num_heads=2"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, timeout=300)

    for command in (["-m", "pape_hub.run", str(script), *common, "--pretrained-path", str(weights)],
                    ["-m", "pape_hub.run", str(script), *common, "--initial-checkpoint", str(tmp_path / "timm.pth")],
                    [str(script), *common, "--device-modules", "pape_hub"]):
        done = run(*command)
        assert done.returncode == 0 and done.stdout.strip().endswith("(2, 2)"), done.stderr[-2000:]
    plain = run(str(script), *common)  # the negative control: without either, timm cannot see the models
    assert plain.returncode != 0 and "Unknown model (vit_t4_pape)" in plain.stderr
    usage = run("-m", "pape_hub.run")
    assert usage.returncode == 2 and "python -m pape_hub.run SCRIPT" in usage.stderr


# --- 4. dense-task heads ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ["pape", "rope_mixed", "ape"])
def test_autobackbone_feeds_a_host_segmentation_head(encoding):
    from transformers import AutoBackbone, UperNetConfig, UperNetForSemanticSegmentation

    from pape_hub.hf import PapeViTConfig

    config = PapeViTConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
                           image_size=32, patch_size=4, position_encoding=encoding, out_indices=[1, 2, 3, 4])
    backbone = AutoBackbone.from_config(config).eval()
    x = torch.randn(2, 3, 32, 48)  # another size than the config's: the grid follows the input
    with torch.no_grad():
        maps = backbone(x).feature_maps
    assert [tuple(m.shape) for m in maps] == [(2, 32, 8, 12)] * 4 and backbone.channels == [32] * 4
    head = UperNetForSemanticSegmentation(UperNetConfig(backbone_config=config, num_labels=5, hidden_size=16,
                                                        auxiliary_in_channels=32)).eval()
    with torch.no_grad():
        assert head(torch.randn(2, 3, 32, 32)).logits.shape == (2, 5, 32, 32)


def test_the_backbone_is_the_classifiers_blocks(tmp_path):
    """A classifier checkpoint loads as a backbone: its feature maps are the timm model's intermediates. (A local
    folder through the class: transformers 5.23's AutoBackbone.from_pretrained asks the Hub whether a local path
    exists as a repo and fails for every model; a Hub id goes through AutoBackbone, tested above.)"""
    from pape_hub.hf import PapeViTBackbone

    torch.manual_seed(0)
    model = timm.create_model("vit_t4_pape", num_classes=3, **TINY).eval()
    folder = save_checkpoint(model, tmp_path / "ck")
    backbone = PapeViTBackbone.from_pretrained(folder, out_indices=[1, 2]).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = backbone(x).feature_maps
        theirs = model.forward_intermediates(x, indices=[0, 1], norm=True, intermediates_only=True)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ours, theirs))


# --- 7. accelerate's launcher -----------------------------------------------------------------------------------
def test_a_launch_that_asked_for_two_processes_and_started_one_says_so(tmp_path):
    args = ["--model", "vit_t4_pape", "--model-kwargs", '{"patch_size": 12, "embed_dim": 32, "depth": 1, '
            '"num_heads": 2}', "--epochs", "1", "--train-size", "32", "--eval-size", "16", "--batch-size", "16",
            "--output-dir", str(tmp_path / "run"), "--quiet"]
    done = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "-m",
                           "pape_hub_cli", "train", *args], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "asked for 2 processes but started one" in done.stderr and "--multi_gpu" in done.stderr


def test_a_multi_gpu_launch_without_gpus_is_refused_before_anything_is_written(tmp_path):
    """--multi_gpu on a CPU machine starts two processes that each train alone: both refuse, naming the fix, and
    the output folder is never made (they used to collide in it and report a run already there)."""
    args = ["--model", "vit_t4_pape", "--model-kwargs", '{"patch_size": 12, "embed_dim": 32, "depth": 1, '
            '"num_heads": 2}', "--epochs", "1", "--train-size", "32", "--eval-size", "16", "--batch-size", "16",
            "--output-dir", str(tmp_path / "run"), "--quiet"]
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    done = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m",
                           "pape_hub_cli", "train", *args], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(env, CUDA_VISIBLE_DEVICES=""))
    assert done.returncode != 0
    assert done.stderr.count("did not join one run") == 2 and "ACCELERATE_USE_CPU=true" in done.stderr, \
        done.stderr[-2000:]
    assert "already holds a run" not in done.stderr and not (tmp_path / "run").exists()


def test_card_metadata_reads_back_through_huggingface_hubs_parser(tmp_path):
    """What the Hub shows: the library whose snippet runs (transformers, remote code), the task (video too), the
    dataset as a Hub id or not at all, the evaluated split, and a converted source's cited accuracy with its
    source and base model."""
    from huggingface_hub import ModelCard

    from pape_hub.card import card_from_folder, render_model_card
    from pape_hub.records import Evaluation, SweepRow

    torch.manual_seed(0)
    folder = save_checkpoint(timm.create_model("vit_t4_pape", num_classes=3, **TINY).eval(), tmp_path / "image",
                             results=Evaluation([SweepRow(32, False, 0.9, 1.0, 0.3, 40)], dataset="imagefolder:pets",
                                                split="val", num_classes=3, trained_at=32, sweep_unit="px"),
                             extra=dict(dataset=dict(spec="imagefolder:pets")))
    card = ModelCard.load(card_from_folder(folder, repo_id="org/pets"))
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "image-classification"
    assert not card.data.datasets and "arrow" not in card.content
    assert card.data.eval_results[0].dataset_split == "validation" and card.data.eval_results[0].metric_value == 0.9
    flowers = save_checkpoint(timm.create_model("vit_t4_pape", num_classes=3, **TINY), tmp_path / "flowers",
                              extra=dict(dataset=dict(spec="hf:org/flowers")))
    assert ModelCard.load(card_from_folder(flowers)).data.datasets == ["org/flowers"]
    video = save_checkpoint(timm.create_model("vivit_t16_rope", num_classes=2, img_size=32, num_frames=4, **TINY),
                            tmp_path / "video", extra=dict(dataset=dict(spec="motion")))
    video_card = ModelCard.load(card_from_folder(video))
    assert video_card.data.pipeline_tag == "video-classification" and "AutoModelForVideoClassification" in \
        video_card.content
    converted = dict(position_encoding="rope_mixed", architecture="vit_b16_rope_mixed", model_args={},
                     pretrained_cfg={}, pape_hub=dict(converted_from=dict(
                         entry="vit_b16_rope_mixed.naver_in1k", hf_hub_id="timm/x", license="apache-2.0",
                         reported=dict(top1_by_size={224: 83.8}, by="rope-vit README", url="https://x.org"))))
    parsed = ModelCard(str(render_model_card(converted)))
    assert parsed.data.base_model == "timm/x"
    result = parsed.data.eval_results[0]
    assert (result.metric_value, result.source_name, result.dataset_type) == (83.8, "rope-vit README", "imagenet-1k")


def test_a_card_says_when_a_model_is_at_chance(tmp_path):
    from pape_hub.card import card_from_folder
    from pape_hub.records import Evaluation, SweepRow

    rows = [SweepRow(4, False, 0.246, 1.0, 1.39, 2000)]
    folder = save_checkpoint(timm.create_model("vit_t4_pape", num_classes=4, **TINY), tmp_path / "ck",
                             results=Evaluation(rows, dataset="arrows", num_classes=4, trained_at=4,
                                                sweep_unit="grid", split="generated test seed"),
                             extra=dict(dataset=dict(spec="arrows")))
    text = card_from_folder(folder).read_text()
    assert "**This model performs at chance.** Its top-1 at the training size, 0.246" in text
    learned = Evaluation([SweepRow(4, False, 0.31, 1.0, 1.2, 2000)], num_classes=4, trained_at=4)
    assert learned.at_chance() is None
