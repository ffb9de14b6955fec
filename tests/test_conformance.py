"""Behaving like a native timm and transformers model: meta-device construction then ``init_weights`` (both faces,
one init), timm's factory kwargs (``device``, ``dtype``) and model attributes, torch.fx feature extraction,
transformers' gradient-checkpointing convention, and ONNX export of every encoding that can be exported."""

from __future__ import annotations

import pytest
import timm
import torch
from host_suites import one_name_per_encoding_class
from timm.models._features_fx import create_feature_extractor, get_graph_node_names

import pape_hub
from pape_hub.hf import PapeViTForImageClassification, PapeViViTForVideoClassification
from pape_hub.hf.convert import config_from_timm

TINY = dict(embed_dim=32, depth=2, num_heads=2, num_classes=3)
VIDEO = dict(TINY, img_size=32, num_frames=4)
#: no ONNX operator for matrix_exp (LieRE); SaPE2's content-dependent bias fails torch's ONNX decomposition
NOT_EXPORTABLE = {"liere", "liere8", "sape2", "sape2_ape"}


def names() -> list[tuple[str, dict]]:
    out = [(f"vit_t4_{e}", TINY) for e in pape_hub.list_encodings()]
    return out + [(f"vivit_t16_{e}", VIDEO) for e in pape_hub.list_encodings() if f"vivit_t16_{e}" in
                  timm.list_models("vivit_t16_*")]


def example(name: str) -> torch.Tensor:
    return torch.randn(2, 3, 4, 32, 32) if name.startswith("vivit") else torch.randn(2, 3, 32, 32)


def poisoned(model: torch.nn.Module) -> torch.nn.Module:
    """Every tensor NaN: what ``to_empty`` may leave."""
    for t in [*model.parameters(), *model.buffers()]:
        t.data.fill_(float("nan"))
    return model


def not_finite(model: torch.nn.Module) -> list[str]:
    return [n for n, t in [*model.named_parameters(), *model.named_buffers()] if not torch.isfinite(t).all()]


@pytest.mark.parametrize("name,kwargs", names(), ids=[n for n, _ in names()])
def test_meta_construction_then_init_weights_initialises_everything_on_both_faces(name, kwargs):
    reference = timm.create_model(name, **kwargs)
    with torch.device("meta"):
        model = timm.create_model(name, **kwargs)
    model = poisoned(model.to_empty(device="cpu"))
    model.init_weights()
    assert not not_finite(model)
    computed = {n: b for n, b in reference.named_buffers()}  # frequencies, slopes, scales: computed, not drawn
    assert all(torch.equal(b, computed[n]) for n, b in model.named_buffers() if "isotropic" not in n)
    hf_class = PapeViViTForVideoClassification if name.startswith("vivit") else PapeViTForImageClassification
    config = config_from_timm(reference)
    with torch.device("meta"):
        hf = hf_class(config)
    hf = poisoned(hf.to_empty(device="cpu"))
    hf.init_weights()
    assert not not_finite(hf)
    with torch.no_grad():
        assert torch.isfinite(hf(example(name).transpose(1, 2) if name.startswith("vivit") else example(name))
                              .logits).all()


@pytest.mark.parametrize("encoding", ["ape", "pape", "rope_mixed", "liere8", "sape2"])
def test_one_init_both_faces_the_same_seed_the_same_tensors(encoding):
    torch.manual_seed(7)
    timm_model = timm.create_model(f"vit_t4_{encoding}", **TINY)
    config = config_from_timm(timm_model)
    torch.manual_seed(7)
    hf = PapeViTForImageClassification(config)
    hf_state = hf.vit.state_dict()
    assert all(torch.equal(t, hf_state[k]) for k, t in timm_model.state_dict().items())


def test_timm_factory_kwargs_device_dtype_and_model_attributes():
    model = timm.create_model("vit_t4_pape", device="meta", dtype=torch.bfloat16, **TINY)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model = timm.create_model("vit_t4_rope", in_chans=1, **TINY)
    assert model.in_chans == 1 and model.num_classes == 3 and model.num_features == 32
    assert "device" not in model._model_args and "dtype" not in model._model_args


@pytest.mark.parametrize("name,kwargs", names(), ids=[n for n, _ in names()])
def test_torch_fx_feature_extraction(name, kwargs):
    model = timm.create_model(name, **kwargs).eval()
    nodes = get_graph_node_names(model)[0]
    features = create_feature_extractor(model, return_nodes={"blocks.0": "first", nodes[-1]: "logits"})
    x = example(name)
    with torch.no_grad():
        out = features(x)
        assert torch.allclose(out["logits"], model(x), atol=1e-6)
        assert out["first"].shape[-1] == 32


def test_gradient_checkpointing_follows_transformers_convention():
    from transformers.modeling_layers import GradientCheckpointingLayer

    timm_model = timm.create_model("vit_t4_pape", **TINY)
    hf = PapeViTForImageClassification(config_from_timm(timm_model))
    hf.vit.load_state_dict(timm_model.state_dict())
    hf.train()
    assert all(isinstance(b, GradientCheckpointingLayer) for b in hf.vit.blocks)
    x = torch.randn(2, 3, 32, 32)
    hf(x).logits.sum().backward()
    plain = {n: p.grad.clone() for n, p in hf.named_parameters()}
    hf.zero_grad()
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert all(b.gradient_checkpointing for b in hf.vit.blocks)
    hf(x).logits.sum().backward()
    assert all(torch.allclose(p.grad, plain[n], atol=1e-6) for n, p in hf.named_parameters())
    # the timm face keeps timm's switch
    timm_model.set_grad_checkpointing(True)
    timm_model.train()
    timm_model(x).sum().backward()


@pytest.mark.parametrize("encoding", one_name_per_encoding_class())
def test_export_at_dynamic_sizes(encoding):
    """torch.export with dynamic batch, height and width for every encoding class (a variant such as ``rope_ape``
    adds ``ape``'s table, exported on its own), run at another size than it was traced at; ONNX from the same
    program for every encoding ONNX can express, run by onnxruntime at both sizes."""
    import warnings

    from torch.export import Dim

    model = timm.create_model(f"vit_t4_{encoding}", **TINY).eval()
    x, y = torch.randn(2, 3, 32, 32), torch.randn(3, 3, 24, 40)
    sizes = {"x": {0: Dim("b", min=1, max=64), 2: 4 * Dim("h", min=2, max=64), 3: 4 * Dim("w", min=2, max=64)}}
    program = torch.export.export(model, (x,), dynamic_shapes=sizes)
    with torch.no_grad():
        assert torch.allclose(program.module()(y), model(y), atol=1e-5)
    if encoding in NOT_EXPORTABLE:
        return
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_program = torch.onnx.export(program, dynamo=True, verbose=False, optimize=False)
    session = ort.InferenceSession(onnx_program.model_proto.SerializeToString())
    for inputs in (x, y):  # the traced size and another one
        out = session.run(None, {session.get_inputs()[0].name: inputs.numpy()})[0]
        assert abs(out - model(inputs).detach().numpy()).max() < 1e-4


@pytest.mark.parametrize("encoding", sorted(NOT_EXPORTABLE))
def test_the_encodings_that_cannot_export_to_onnx_still_fail(encoding):
    """A negative control: if this starts passing, move the encoding out of NOT_EXPORTABLE and the README list."""
    pytest.importorskip("onnxscript")
    import warnings

    model = timm.create_model(f"vit_t4_{encoding}", **TINY).eval()
    with warnings.catch_warnings(), pytest.raises(Exception):  # noqa: B017 - the exporter's own error types
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 3, 32, 32),), dynamo=True, verbose=False)


MINIMAL = '''
import importlib.abc, importlib.util, sys
BLOCK = {"transformers", "huggingface_hub", "accelerate", "datasets", "av", "sklearn", "matplotlib", "filelock",
         "tqdm", "safetensors"}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCK:
            raise ImportError(f"not installed: {name}")
sys.meta_path.insert(0, Blocker())
find = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in BLOCK else find(name, *a)
import torch, timm, pape_hub
assert timm.create_model("vit_b16_pape", device="meta").num_classes == 1000
print(tuple(timm.create_model("vit_t4_rope_mixed").eval()(torch.randn(1, 3, 32, 32)).shape))
try:
    pape_hub.save_checkpoint
except ImportError as err:
    print(err)
'''


def test_the_models_need_torch_and_timm_only():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", MINIMAL], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(1, 10)" in done.stdout and "needs the 'hf' extra: pip install 'pape_hub[hf]'" in done.stdout


LAZY_FACE = '''
import sys, pape_hub
assert "transformers" not in sys.modules  # import pape_hub costs timm users no transformers import
from transformers import pipeline  # the first transformers import registers the face (no circular import)
from transformers import AutoConfig, AutoModelForImageClassification
config = AutoConfig.for_model("pape_vit", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=64, image_size=32, patch_size=8, num_labels=3)
print(type(config).__name__, type(AutoModelForImageClassification.from_config(config)).__name__)
print(type(AutoConfig.for_model("pape_vivit")).__name__, pipeline.__name__)
'''


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_the_transformers_face_registers_when_transformers_is_imported():
    """``import pape_hub`` leaves transformers unimported; the first import of transformers, whichever statement
    makes it (here ``from transformers import pipeline``, whose chain once met the face half-way), registers the
    configs, models and processors with the Auto classes."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LAZY_FACE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["PapeViTConfig", "PapeViTForImageClassification", "PapeViViTConfig", "pipeline"]
    face_first = ("import sys, pape_hub\nconfig = pape_hub.hf.PapeViTConfig()  # the face itself, before transformers\n"
                  "from transformers import AutoConfig\nprint(type(AutoConfig.for_model('pape_vit')).__name__)")
    done = subprocess.run([sys.executable, "-c", face_first], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["PapeViTConfig"], done.stderr[-2000:]
