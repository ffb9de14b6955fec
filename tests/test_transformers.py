"""The transformers face: Auto classes, save/load, heads, eager vs SDPA, outputs, conversion to and from timm,
loading without pape_hub (remote code), Trainer fine-tuning. Modelled on transformers' ModelTesterMixin checks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import timm
import torch
from test_data import make_imagefolder
from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoModelForImageClassification

import pape_hub  # noqa: F401 - registers the Auto classes
from pape_hub.checkpoint import save_checkpoint
from pape_hub.hf import (
    PapeViTConfig,
    PapeViTForImageClassification,
    PapeViTImageProcessor,
    PapeViTModel,
    image_processor_for,
    timm_to_transformers,
    transformers_to_timm,
)

ENCODINGS = pape_hub.list_encodings()


def tiny_config(encoding: str = "pape", **kwargs) -> PapeViTConfig:
    values = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
                  patch_size=8, position_encoding=encoding, num_labels=3, timm_architecture=f"vit_t4_{encoding}")
    values.update(kwargs)
    return PapeViTConfig(**values)


def pixels(size: int = 32, n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))


def test_auto_classes_resolve():
    config = AutoConfig.for_model("pape_vit", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, image_size=32, patch_size=8, position_encoding="rope")
    assert isinstance(config, PapeViTConfig)
    assert isinstance(AutoModel.from_config(config), PapeViTModel)
    model = AutoModelForImageClassification.from_config(config).eval()
    assert isinstance(model, PapeViTForImageClassification)
    # a configuration made without timm still converts: any registered name of the encoding builds it
    with torch.no_grad():
        assert torch.equal(transformers_to_timm(model).eval()(pixels()), model(pixels()).logits)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_outputs_eager_equals_sdpa_and_shapes(encoding):
    torch.manual_seed(0)
    model = PapeViTForImageClassification(tiny_config(encoding)).eval()
    x = pixels()
    with torch.no_grad():
        sdpa = model(x, output_hidden_states=True)
        model.config._attn_implementation = "eager"
        eager = model(x, output_hidden_states=True, output_attentions=True)
    torch.testing.assert_close(sdpa.logits, eager.logits, rtol=1e-4, atol=1e-5)
    assert sdpa.logits.shape == (2, 3) and len(sdpa.hidden_states) == 3  # embeddings + 2 blocks
    assert sdpa.attentions is None and len(eager.attentions) == 2
    assert eager.attentions[0].shape == (2, 2, 17, 17)
    torch.testing.assert_close(eager.attentions[0].sum(-1), torch.ones(2, 2, 17))


def test_save_load_roundtrip_labels_and_determinism(tmp_path):
    config = tiny_config("rope_mixed", id2label={0: "cat", 1: "dog", 2: "fox"}, label2id={"cat": 0, "dog": 1, "fox": 2})
    model = PapeViTForImageClassification(config).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not (tmp_path / "pytorch_model.bin").exists()
    loaded = AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    x = pixels()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)
        torch.testing.assert_close(loaded(x).logits, loaded(x).logits, rtol=0, atol=0)
    assert loaded.config.id2label[2] == "fox" and loaded.config.num_labels == 3
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_new_head_with_ignore_mismatched_sizes(tmp_path):
    PapeViTForImageClassification(tiny_config("pape")).save_pretrained(tmp_path)
    model = AutoModelForImageClassification.from_pretrained(tmp_path, num_labels=5, ignore_mismatched_sizes=True)
    assert model(pixels()).logits.shape == (2, 5)
    assert model.vit.head.weight.abs().max() < 1  # re-initialised, not garbage
    backbone = AutoModel.from_pretrained(tmp_path)  # a classification checkpoint loads into the backbone
    assert backbone(pixels()).pooler_output.shape == (2, 32)


def test_loss_and_labels():
    model = PapeViTForImageClassification(tiny_config("alibi"))
    out = model(pixels(), labels=torch.tensor([0, 2]))
    assert out.loss.ndim == 0 and out.loss.requires_grad
    out.loss.backward()


def test_any_resolution_and_interpolate_pos_encoding():
    model = PapeViTForImageClassification(tiny_config("sincos")).eval()
    with torch.no_grad():
        plain = model(pixels(64)).logits
        interp = model(pixels(64), interpolate_pos_encoding=True).logits
        assert plain.shape == interp.shape == (2, 3)
        assert not torch.allclose(plain, interp)
        torch.testing.assert_close(model(pixels(32), interpolate_pos_encoding=True).logits, model(pixels(32)).logits)


def test_gradient_checkpointing_same_gradients():
    torch.manual_seed(0)
    model = PapeViTForImageClassification(tiny_config("liere8"))
    x, y = pixels(), torch.tensor([1, 2])
    model(x, labels=y).loss.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.activation_checkpointing_enable()
    assert model.vit.grad_checkpointing
    model.train()
    model(x, labels=y).loss.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], rtol=1e-4, atol=1e-6, msg=n)


def test_init_weights():
    model = PapeViTForImageClassification(tiny_config("pape", hidden_size=256, intermediate_size=512,
                                                      num_attention_heads=4))
    std = model.vit.blocks[0].mlp.fc1.weight.std().item()
    assert 0.015 < std < 0.025 and torch.all(model.vit.blocks[0].mlp.fc1.bias == 0)
    assert torch.all(model.vit.blocks[0].norm1.weight == 1)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("encoding", ["pape", "rope_mixed", "lookhere"])
def test_timm_transformers_conversion_is_lossless(encoding):
    torch.manual_seed(0)
    timm_model = timm.create_model(f"vit_t4_{encoding}", embed_dim=32, depth=2, num_heads=2, num_classes=3).eval()
    hf = timm_to_transformers(timm_model, ["a", "b", "c"])
    back = transformers_to_timm(hf).eval()
    x = pixels()
    with torch.no_grad():
        assert torch.equal(hf(x).logits, timm_model(x))
        assert torch.equal(back(x), timm_model(x))
    assert hf.config.position_encoding == encoding and hf.config.id2label[1] == "b"


def test_one_folder_loads_from_both_faces(tmp_path):
    timm_model = timm.create_model("vit_t4_pape", embed_dim=32, depth=2, num_heads=2, num_classes=3).eval()
    timm_to_transformers(timm_model, ["a", "b", "c"]).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "pape_vit" and config["architecture"] == "vit_t4_pape"
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForImageClassification", "AutoBackbone"}
    assert config["label_names"] == ["a", "b", "c"]
    via_timm = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    via_hf = AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    x = pixels()
    with torch.no_grad():
        assert torch.equal(via_timm(x), timm_model(x)) and torch.equal(via_hf(x).logits, timm_model(x))


def test_image_processor_registered_and_saved(tmp_path):
    config = tiny_config("rope")
    PapeViTForImageClassification(config).save_pretrained(tmp_path)  # config.json with timm's fields, the processor
    loaded = AutoImageProcessor.from_pretrained(tmp_path)
    # timm's eval transform step by step: the short side to size / crop_pct, the centre crop (the zoo's crop_pct)
    crop_pct = timm.models.get_pretrained_cfg(config.timm_name()).crop_pct
    assert type(loaded).__name__ == "BitImageProcessor" and loaded.crop_size["height"] == 32 and loaded.resample == 3
    assert loaded.size == {"shortest_edge": int(32 / crop_pct)}
    assert (image_processor_for(config).size, image_processor_for(config).crop_size) == (loaded.size, loaded.crop_size)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    # transformers' own processor: every client loads it from a folder or a Hub id, with or without pape_hub, and
    # no remote-code pointer makes transformers' video fallback ask "run custom code? [y/N]" in image pipelines
    assert saved["image_processor_type"] == "BitImageProcessor" and "auto_map" not in saved
    model_config = json.loads((tmp_path / "config.json").read_text())
    assert model_config["image_processor_type"] == "BitImageProcessor"
    assert "AutoImageProcessor" not in model_config["auto_map"]
    PapeViTForImageClassification(config).save_pretrained(tmp_path / "legacy")
    legacy = PapeViTImageProcessor(size={"height": 32, "width": 32})  # the name folders saved before 0.2 give
    legacy.save_pretrained(tmp_path / "legacy")
    legacy_config = json.loads((tmp_path / "legacy" / "config.json").read_text())
    legacy_config["image_processor_type"] = "PapeViTImageProcessor"  # as such a folder's config.json named it
    (tmp_path / "legacy" / "config.json").write_text(json.dumps(legacy_config))
    assert type(AutoImageProcessor.from_pretrained(tmp_path / "legacy")).__name__ in ("ViTImageProcessor",
                                                                                     "PapeViTImageProcessor")


def test_pipelines_never_prompt_for_custom_code(tmp_path, monkeypatch):
    """With pape_hub imported, a checkpoint folder runs in transformers' pipelines without a question."""
    import builtins

    from transformers import pipeline

    def no_prompt(*args):
        raise AssertionError(f"transformers asked: {args}")

    monkeypatch.setattr(builtins, "input", no_prompt)
    torch.manual_seed(0)
    image = timm.create_model("vit_t4_pape", embed_dim=32, depth=2, num_heads=2, num_classes=3).eval()
    save_checkpoint(image, tmp_path / "image", label_names=["a", "b", "c"])
    from PIL import Image

    top = pipeline("image-classification", model=str(tmp_path / "image"))(Image.new("RGB", (32, 32)))[0]
    assert top["label"] in ("a", "b", "c")
    video = timm.create_model("vivit_t16_rope", embed_dim=32, depth=2, num_heads=2, num_classes=3, img_size=32,
                              num_frames=4).eval()
    save_checkpoint(video, tmp_path / "video", label_names=["a", "b", "c"])
    assert type(pipeline("video-classification", model=str(tmp_path / "video")).video_processor).__name__ == \
        "PapeViViTVideoProcessor"


def test_loads_without_pape_hub_via_remote_code(tmp_path):
    torch.manual_seed(0)
    model = PapeViTForImageClassification(tiny_config("pape_ri")).eval()
    model.save_pretrained(tmp_path / "model")
    image_processor_for(model.config).save_pretrained(tmp_path / "model")
    x = pixels()
    torch.save(x, tmp_path / "x.pt")
    with torch.no_grad():
        torch.save(model(x).logits, tmp_path / "y.pt")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["pape_hub"] = None  # not importable here
        import torch
        from transformers import AutoImageProcessor, AutoModel, AutoModelForImageClassification
        path = {str(tmp_path / "model")!r}
        model = AutoModelForImageClassification.from_pretrained(path, trust_remote_code=True).eval()
        x, y = torch.load({str(tmp_path / "x.pt")!r}), torch.load({str(tmp_path / "y.pt")!r})
        with torch.no_grad():
            assert torch.equal(model(x).logits, y)
        assert type(model).__module__.startswith("transformers_modules")
        assert AutoModel.from_pretrained(path, trust_remote_code=True)(x).pooler_output.shape == (2, 32)
        processor = AutoImageProcessor.from_pretrained(path, trust_remote_code=True)
        assert type(processor).__name__ == "BitImageProcessor"
        model.save_pretrained(path + "_again")  # a remote copy saves a loadable folder too
        again = AutoModelForImageClassification.from_pretrained(path + "_again", trust_remote_code=True).eval()
        with torch.no_grad():
            assert torch.equal(again(x).logits, y)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_trainer_finetune_script_and_pipeline(tmp_path):
    sys.path.insert(0, "scripts")
    try:
        import finetune_trainer
    finally:
        sys.path.pop(0)
    make_imagefolder(tmp_path / "data", classes=("cat", "dog", "fox"), per_class=4, size=16)
    result = finetune_trainer.main([
        "--model", "vit_t4_pape", "--dataset", f"imagefolder:{tmp_path / 'data'}", "--output-dir",
        str(tmp_path / "ft"), "--epochs", "1", "--batch-size", "4", "--image-size", "16",
    ])
    assert "eval_accuracy" in result["eval"]
    assert len(result["predictions"]) == 3  # the 3 validation images
    assert result["predictions"][0]["label"] in ("cat", "dog", "fox")
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path / "ft" / "final")
    assert reloaded.config.id2label[0] == "cat"
