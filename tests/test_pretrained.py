"""Public checkpoints converted on the fly (:mod:`pape_hub.models.pretrained`), proven by equal logits.

Each source is built by its own timm code at a small size with non-trivial weights (LayerNorm affines, biases,
layer-scale gains away from their init, q/k rows scaled up so attention is sharp: with near-uniform attention a
wrong position convention hardly shows). Negative controls (x/y swapped, layer scale dropped) must fail by far.
The Hub test serves the sources' own files (timm's ``push_to_hf_hub``) under their real repo ids from the local
Hub and loads them through every user path.
"""

from __future__ import annotations

import json

import pytest
import timm
import torch
from test_hub import client, hub  # noqa: F401 - the local Hub fixture

import pape_hub
from pape_hub.models.lookhere_reference import LookHereReference
from pape_hub.models.pretrained import SOURCES, convert_state_dict, transplant

SMALL = dict(embed_dim=64, depth=2, num_heads=4, img_size=64, num_classes=5)
#: one entry per source family: (pape_hub entry, float64 tolerance). timm's Eva computes RoPE angles and sin/cos in
#: float32 whatever the model's dtype (its get_mixed_freqs / rotary tables), which bounds a float64 comparison with
#: the Naver models at float32 angle rounding; every other source matches to the last bit.
FAMILIES = {
    "vit_s16_ape.augreg_in21k_ft_in1k": 1e-10,
    "vit_s16_ape.fb_in1k": 1e-10,
    "vit_s16_ape.fb_deit3_in1k": 1e-10,
    "vit_b16_ape.mae": 1e-10,
    "vit_s16_rope.naver_in1k": 1e-5,
    "vit_s16_rope_mixed.naver_in1k": 1e-5,
    "vit_s16_rope_ape.naver_in1k": 1e-5,
    "vit_s16_rope_mixed_ape.naver_in1k": 1e-5,
    "vit_s16_rope_dinov3.lvd1689m": 1e-5,  # timm's DINOv3 RoPE: float32 angles too
    "vit_s16_rope_dinov3.lvd1689m_plus": 1e-5,  # S+: the SwiGLU MLP
}


@torch.no_grad()
def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        r = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
        if name.endswith(("norm1.weight", "norm2.weight", "norm.weight")):
            p.copy_(1 + 0.3 * r)
        elif "gamma" in name:
            p.copy_(0.5 + 0.3 * r)
        elif name.endswith("bias"):
            p.copy_(0.1 * r)
        elif name.endswith("qkv.weight"):
            dim = p.shape[1]
            p.copy_(r * dim**-0.5)
            p[: 2 * dim] *= 3  # sharp attention: position conventions show
        elif name.endswith(("freqs", "pos_embed")):
            p.copy_(r)
        else:
            p.copy_(r * p.shape[-1] ** -0.5 if p.ndim > 1 else 0.5 * r)
    return model


def small_args(entry: str) -> dict:
    return dict(SMALL, num_classes=0) if SOURCES[entry].model_args.get("num_classes") == 0 else dict(SMALL)


def source_model(entry: str, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    return randomise(timm.create_model(SOURCES[entry].timm_name.split(".")[0], dtype=dtype, **small_args(entry))).eval()


def converted(entry: str, state: dict, dtype: torch.dtype = torch.float64, **kwargs) -> torch.nn.Module:
    model = timm.create_model(entry, **{**small_args(entry), **kwargs}).to(dtype).eval()
    out, _ = convert_state_dict(state, model)
    model.load_state_dict(out)
    return model


def max_diff(a: torch.nn.Module, b: torch.nn.Module, dtype: torch.dtype = torch.float64) -> float:
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1), dtype=dtype)
    with torch.no_grad():
        return float((a(x) - b(x)).abs().max())


@pytest.mark.parametrize("entry", FAMILIES)
def test_each_source_converts_to_equal_logits(entry):
    source = source_model(entry)
    assert max_diff(source, converted(entry, source.state_dict())) <= FAMILIES[entry]
    source32 = source_model(entry, torch.float32)
    assert max_diff(source32, converted(entry, source32.state_dict(), torch.float32), torch.float32) <= 1e-4


def swap_table_axes(table: torch.Tensor, prefix: int) -> torch.Tensor:
    cells = table[:, prefix:]
    side = int(cells.shape[1] ** 0.5)
    swapped = cells.reshape(1, side, side, -1).transpose(1, 2).reshape(cells.shape)
    return torch.cat([table[:, :prefix], swapped], dim=1)


def test_negative_controls_fail():
    """A wrong convention moves the logits by far more than any tolerance above."""
    deit3 = source_model("vit_s16_ape.fb_deit3_in1k")
    state = dict(deit3.state_dict(), pos_embed=swap_table_axes(deit3.state_dict()["pos_embed"], 0))
    assert max_diff(deit3, converted("vit_s16_ape.fb_deit3_in1k", state)) > 1e-2  # x/y swapped
    no_gain = {k: v for k, v in deit3.state_dict().items() if ".ls" not in k}
    model = timm.create_model("vit_s16_ape.fb_deit3_in1k", **SMALL).double().eval()
    model.load_state_dict(convert_state_dict(no_gain, model)[0], strict=False)
    assert max_diff(deit3, model) > 1e-2  # layer scale dropped

    mixed = source_model("vit_s16_rope_mixed.naver_in1k")
    state = dict(mixed.state_dict(), **{"rope.freqs": mixed.state_dict()["rope.freqs"].flip(0)})
    assert max_diff(mixed, converted("vit_s16_rope_mixed.naver_in1k", state)) > 1e-2  # x/y swapped

    mixed_ape = source_model("vit_s16_rope_mixed_ape.naver_in1k")
    state = dict(mixed_ape.state_dict(), pos_embed=swap_table_axes(mixed_ape.state_dict()["pos_embed"], 0))
    assert max_diff(mixed_ape, converted("vit_s16_rope_mixed_ape.naver_in1k", state)) > 1e-2  # table x/y swapped

    axial = source_model("vit_s16_rope.naver_in1k")
    wrong = timm.create_model("vit_s16_rope.naver_in1k", **SMALL).double().eval()
    wrong.load_state_dict(convert_state_dict(axial.state_dict(), wrong)[0])
    wrong.pos_encoding.freqs.mul_(2)  # another temperature
    assert max_diff(axial, wrong) > 1e-2


def test_dinov3_negative_controls_fail():
    """DINOv3: its channel layout, its axis order and its image-relative coordinates each matter."""
    from pape_hub.models.pretrained import Conversion, _eva_backbone, dinov3_qk_order, permute_qk_channels

    entry = "vit_s16_rope_dinov3.lvd1689m"
    source = source_model(entry)
    model = converted(entry, source.state_dict())
    renamed = dict(_eva_backbone(source.state_dict(), Conversion("dinov3")), **{
        k: v for k, v in model.state_dict().items() if k.startswith("pos_encoding.")})
    model.load_state_dict(renamed)
    assert max_diff(source, model) > 1e-2  # q/k channels left in DINOv3's layout
    quarter = 16 // 4  # head dim 16: x and y frequencies swapped
    swapped = [c for j in range(8) for c in ((j % quarter) + (j < quarter) * 0 + (j >= quarter) * quarter,)]
    order = [i for j in swapped for i in (j, j + 8)]
    assert order != dinov3_qk_order(16)
    model.load_state_dict(permute_qk_channels(renamed, order, 4, 2))
    assert max_diff(source, model) > 1e-2  # x and y swapped
    integer = timm.create_model("vit_s16_rope", **dict(small_args(entry), reg_tokens=4, init_values=1e-5,
                                norm_eps=1e-5, qkv_bias=False, global_pool="avg", fc_norm=False)).double().eval()
    integer.load_state_dict(convert_state_dict(source.state_dict(), converted(entry, source.state_dict()))[0])
    assert max_diff(source, integer) > 1e-2  # integer patch coordinates instead of DINOv3's


def test_register_tokens_are_unpositioned_prefix_tokens():
    """Registers are prefix tokens like CLS: no encoding positions them, so swapping two registers' values changes
    nothing (for every encoding without a learned row per prefix token), and pooling skips them."""
    from pape_hub.encodings import list_encodings

    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for name in list_encodings():
        torch.manual_seed(0)
        model = timm.create_model(f"vit_t4_{name}", embed_dim=32, depth=2, num_heads=2, num_classes=3, reg_tokens=2,
                                  img_size=32).double().eval()
        if any(getattr(m, "table_prefix", 0) for m in model.pos_encoding.modules()):
            continue  # a learned row per prefix token positions each register on purpose (timm's ViT does too)
        with torch.no_grad():
            model.reg_token.normal_()
            before = model(x)
            model.reg_token.copy_(model.reg_token.flip(1))
            assert torch.allclose(model(x), before, rtol=0, atol=1e-12), name
    pooled = timm.create_model("vit_t4_rope", embed_dim=32, depth=1, num_heads=2, reg_tokens=3, global_pool="avg",
                               fc_norm=False, class_token=False, num_classes=0).double().eval()
    tokens = pooled.forward_features(x)
    assert tokens.shape[1] == 3 + 64 and torch.allclose(pooled.forward_head(tokens), tokens[:, 3:].mean(1))


def test_layer_scale_folds_into_a_model_without_it():
    """A DeiT-III / Naver checkpoint into a model built without LayerScale: the gains fold into the layers before
    them, exact up to one rounding per weight."""
    for entry in ("vit_s16_ape.fb_deit3_in1k", "vit_s16_rope_mixed.naver_in1k"):
        source = source_model(entry)
        assert max_diff(source, converted(entry, source.state_dict(), init_values=None)) <= FAMILIES[entry]


def test_table_resamples_to_another_grid_like_timm():
    """A 4x4 source table into a 6x6 model: bicubically, as timm resamples its own table (same call)."""
    source = source_model("vit_s16_ape.augreg_in21k_ft_in1k")
    ours = converted("vit_s16_ape.augreg_in21k_ft_in1k", source.state_dict(), img_size=96)
    theirs = timm.create_model("vit_small_patch16_224", **dict(SMALL, img_size=96)).double().eval()
    theirs.load_state_dict(timm.models.vision_transformer.checkpoint_filter_fn(source.state_dict(), theirs))
    x = torch.randn(2, 3, 96, 96, dtype=torch.float64)
    with torch.no_grad():
        assert float((ours(x) - theirs(x)).abs().max()) <= 1e-10


@pytest.mark.parametrize("target", ["pape", "rope_mixed", "liere"])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_transplant_copies_the_backbone_and_initialises_the_encoding(target, device):
    deit3 = source_model("vit_s16_ape.fb_deit3_in1k", torch.float32)
    model = timm.create_model(f"vit_s16_{target}", init_values=1e-6, device=device, **dict(SMALL, num_classes=7))
    report = transplant(deit3.state_dict(), model)
    assert all(torch.isfinite(t).all() for t in model.state_dict().values())
    assert torch.equal(model.blocks[1].attn.qkv.weight, deit3.blocks[1].attn.qkv.weight)
    assert "pos_embed (learned table)" in report.dropped and report.own_init
    assert {"head.weight", "head.bias"} <= set(report.own_init)  # 7 classes, not the source's 5
    assert all(k.startswith("pos_encoding.") for k in report.own_init if not k.startswith("head."))
    fresh = timm.create_model(f"vit_s16_{target}", init_values=1e-6, **dict(SMALL, num_classes=7))
    own = {k for k in fresh.state_dict() if k.startswith("pos_encoding.")}
    assert own == {k for k in model.state_dict() if k.startswith("pos_encoding.")}


def test_untagged_names_stay_random_and_say_which_tags_have_weights(tmp_path):
    model = timm.create_model("vit_s16_ape", **SMALL)
    assert model.pretrained_cfg.get("hf_hub_id") is None and model.pretrained_cfg["mean"][0] == 0.485
    with pytest.raises(ValueError, match=r"vit_s16_ape\.fb_deit3_in1k"):
        timm.create_model("vit_s16_ape", pretrained=True)
    assert "vit_b16_rope_mixed.naver_in1k" in pape_hub.list_pretrained("rope")
    cfg = timm.create_model("vit_s16_ape.augreg_in21k_ft_in1k", **SMALL).pretrained_cfg
    assert cfg["mean"] == (0.5, 0.5, 0.5) and cfg["crop_pct"] == 0.9 and cfg["license"] == "apache-2.0"
    assert cfg["hf_hub_id"] == "timm/vit_small_patch16_224.augreg_in21k_ft_in1k"


def test_pretrained_cfg_overlay_file(tmp_path):
    """``pretrained_cfg_overlay=dict(file=...)``: a source's own file on disk, converted on the fly."""
    from safetensors.torch import save_file

    source = source_model("vit_s16_rope_mixed.naver_in1k", torch.float32)
    save_file(source.state_dict(), tmp_path / "naver.safetensors")
    overlay = dict(file=str(tmp_path / "naver.safetensors"), num_classes=5)  # the small source's 5-class head
    model = timm.create_model("vit_s16_rope_mixed.naver_in1k", pretrained=True, **SMALL,
                              pretrained_cfg_overlay=overlay).eval()
    assert max_diff(source, model, torch.float32) <= 1e-4


def test_save_keeps_the_source_preprocessing_and_every_model_option(tmp_path):
    """A converted model saves and reloads through both faces with its LayerNorm eps, LayerScale, pooling
    without fc_norm, and the source's crop_pct."""
    from transformers import AutoModelForImageClassification

    from pape_hub.checkpoint import save_checkpoint

    model = timm.create_model("vit_s16_ape.fb_deit3_in22k_ft_in1k", norm_eps=1e-5, global_pool="avg", fc_norm=False,
                              **SMALL).eval()
    save_checkpoint(model, tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["pretrained_cfg"]["crop_pct"] == 1.0 and config["layer_norm_eps"] == 1e-5
    via_timm = timm.create_model(f"local-dir:{tmp_path / 'ckpt'}", pretrained=True).eval()
    via_hf = AutoModelForImageClassification.from_pretrained(tmp_path / "ckpt").eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), via_timm(x)) and torch.equal(model(x), via_hf(x).logits)
    assert via_timm.blocks[0].norm1.eps == 1e-5 and via_timm.pretrained_cfg["crop_pct"] == 1.0


PUSH_SOURCES = """
import json, sys, torch, timm, pape_hub
from timm.models import push_to_hf_hub
sys.path.insert(0, "tests")
from test_pretrained import SOURCES, source_model, small_args
logits = {{}}
x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
for entry in {entries}:
    source = source_model(entry, torch.float32)
    repo = SOURCES[entry].timm_name.split(".")[0]
    # timm's own upload of its own model: the layout of timm's Hub repos, under the real repo id
    push_to_hf_hub(source, "timm/" + SOURCES[entry].timm_name, model_args=small_args(entry),
                   safe_serialization=True)
    with torch.no_grad():
        logits[entry] = source(x).tolist()
"""


@pytest.mark.slow  # a subprocess client: scheduled first (conftest)
def test_every_user_path_loads_sources_from_the_hub(hub, tmp_path):  # noqa: F811 - the fixture
    entries = ["vit_s16_ape.fb_deit3_in1k", "vit_s16_rope_mixed.naver_in1k", "vit_b16_ape.mae",
               "vit_s16_rope_dinov3.lvd1689m"]
    done = client(hub, tmp_path, PUSH_SOURCES.format(entries=entries) + """
from transformers import AutoModel, AutoModelForImageClassification
from pape_hub_cli import main
out = {}
for entry in logits:
    want = torch.tensor(logits[entry])
    def diff(model):
        with torch.no_grad():
            got = model(x)
        return float((getattr(got, "logits", got) - want).abs().max())
    classes = dict(num_classes=small_args(entry)["num_classes"])  # the small sources' heads: kept, not dropped
    named = timm.create_model(entry, pretrained=True, **small_args(entry), pretrained_cfg_overlay=classes).eval()
    # any name seeded from the source's repo; without LayerScale the gains fold into the layers before them, and
    # without qkv biases (DINOv3) the model's are zero; registers and pooling are the architecture's, so they are given
    shape = {k: v for k, v in SOURCES[entry].model_args.items() if k in ("reg_tokens", "global_pool", "fc_norm",
                                                                        "norm_eps")}
    overlay = timm.create_model(entry.split(".")[0], pretrained=True, **small_args(entry), **shape,
                                pretrained_cfg_overlay=dict(classes, hf_hub_id="timm/" + SOURCES[entry].timm_name)
                                ).eval()
    args = [f"--set={k}={json.dumps(v)}" for k, v in small_args(entry).items()]
    assert main(["convert", entry, f"{tmp}/{entry}", *args]) == 0
    # a backbone without classes (MAE, DINOv3) loads as transformers' AutoModel: its pooled output is the feature
    auto = AutoModelForImageClassification if small_args(entry)["num_classes"] else AutoModel
    hf = auto.from_pretrained(f"{tmp}/{entry}").eval()
    local = timm.create_model(f"local-dir:{tmp}/{entry}", pretrained=True).eval()
    with torch.no_grad():
        features = hf(x).pooler_output if auto is AutoModel else None
    out[entry] = [diff(named), diff(overlay), diff(hf) if features is None else float((features - want).abs().max()),
                  diff(local)]
print("RESULT", json.dumps(out))
""".replace("{tmp}", str(tmp_path)))
    assert "RESULT" in done.stdout, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    for entry, diffs in result.items():
        assert max(diffs) <= 1e-4, (entry, diffs)
    card = (tmp_path / "vit_s16_rope_mixed.naver_in1k" / "README.md").read_text()
    assert "timm/vit_small_patch16_rope_mixed_224.naver_in1k" in card and "float64" in card
    assert "license: apache-2.0" in card and "base_model: timm/vit_small_patch16_rope_mixed_224.naver_in1k" in card
    assert "The source reports ImageNet-1k top-1 80.9% at 224 px, 81.8% at 384 px (naver-ai/rope-vit" in card
    assert "license: cc-by-nc-4.0" in (tmp_path / "vit_b16_ape.mae" / "README.md").read_text()


# --- LookHere's release: the official .pth ({"config", "weights"}) against an independent reference forward ---------

LH90 = {"global_slope": 2, "layer_slopes": [1.5, 0.5], "head_directions": "corners-triangles-none"}
#: the official code splits heads into its groups for 12 or 16 heads only; 96 wide keeps the test small
LOOKHERE_SMALL = dict(embed_dim=96, depth=2, num_heads=12, img_size=64, num_classes=5, representation_size=384)


def lookhere_release(dtype: torch.dtype = torch.float64, config: dict = LH90) -> dict:
    """A release file's content: the reference model with non-trivial weights, and its config."""
    reference = LookHereReference(config, embed_dim=96, depth=2, num_heads=12, num_classes=5)
    return {"config": dict(config), "weights": randomise(reference.to(dtype)).state_dict()}


def lookhere_pair(dtype: torch.dtype = torch.float64, **kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    release = lookhere_release(dtype)
    reference = LookHereReference.from_release(release).eval()
    model = timm.create_model("vit_b16_lookhere.lh90_in1k", **{**LOOKHERE_SMALL, **kwargs}).to(dtype).eval()
    model.load_state_dict(convert_state_dict(release, model)[0])
    return reference, model


def test_lookhere_release_converts_to_equal_logits():
    """Head order, bias rounding, eps 1e-5 and the pre-logits head converted: equal logits at the training size and,
    since the bias is rebuilt per grid, at a larger non-square one (extrapolation)."""
    reference, model = lookhere_pair()
    assert max_diff(reference, model) <= 1e-10
    x = torch.randn(2, 3, 96, 80, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        assert float((reference(x) - model(x)).abs().max()) <= 1e-10
    assert max_diff(*lookhere_pair(torch.float32), torch.float32) <= 1e-4


def test_lookhere_negative_controls_fail():
    reference, model = lookhere_pair()
    unpermuted = timm.create_model("vit_b16_lookhere.lh90_in1k", **LOOKHERE_SMALL).double().eval()
    backbone = {k.replace("head.fc1.", "pre_logits.fc.").replace("head.fc2.", "head."): v
                for k, v in lookhere_release()["weights"].items()}
    unpermuted.load_state_dict({**unpermuted.state_dict(), **backbone})
    assert max_diff(reference, unpermuted) > 1e-2  # heads left in the release's corner order
    _, wrong_eps = lookhere_pair(norm_eps=1e-6)
    assert max_diff(reference, wrong_eps) > 1e-8
    _, unrounded = lookhere_pair(position_encoding_kwargs={})
    assert max_diff(reference, unrounded) > 1e-8  # small (one bfloat16 step of the bias) but far above 1e-10
    with pytest.raises(ValueError, match="global slope 3"):
        convert_state_dict(lookhere_release(config=dict(LH90, global_slope=3)), model)
    with pytest.raises(ValueError, match="without its configuration"):
        convert_state_dict(lookhere_release()["weights"], model)


PUSH_LOOKHERE = """
import json, sys, torch, timm, pape_hub
from huggingface_hub import HfApi
sys.path.insert(0, "tests")
from test_pretrained import LOOKHERE_SMALL, lookhere_release
from pape_hub.models.lookhere_reference import LookHereReference
from transformers import AutoModelForImageClassification
from pape_hub_cli import main
release = lookhere_release(torch.float32)
torch.save(release, "{tmp}/LH_90_weights_and_config.pth")
api = HfApi()
api.create_repo("antofuller/LookHere")  # the release's own repo and file name
api.upload_file(path_or_fileobj="{tmp}/LH_90_weights_and_config.pth", path_in_repo="LH_90_weights_and_config.pth",
                repo_id="antofuller/LookHere")
x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    want = LookHereReference.from_release(release).eval()(x)
def diff(model):
    with torch.no_grad():
        got = model(x)
    return float((getattr(got, "logits", got) - want).abs().max())
classes = dict(num_classes=5)  # the small release's head: kept, not dropped
named = timm.create_model("vit_b16_lookhere.lh90_in1k", pretrained=True, **LOOKHERE_SMALL,
                          pretrained_cfg_overlay=classes).eval()
args = [f"--set={k}={json.dumps(v)}" for k, v in LOOKHERE_SMALL.items()]
assert main(["convert", "vit_b16_lookhere.lh90_in1k", "{tmp}/lh90", *args]) == 0
hf = AutoModelForImageClassification.from_pretrained("{tmp}/lh90").eval()
local = timm.create_model("local-dir:{tmp}/lh90", pretrained=True).eval()
# seeding PaPE from the release: the backbone is copied, the pre-logits head left out
pape = timm.create_model("vit_b16_pape", pretrained=True, **dict(LOOKHERE_SMALL, representation_size=None),
                         init_values=1e-4, norm_eps=1e-5, pretrained_cfg_overlay=dict(classes,
                         hf_hub_id="antofuller/LookHere", hf_hub_filename="LH_90_weights_and_config.pth"))
same = torch.equal(pape.blocks[1].attn.qkv.weight, release["weights"]["blocks.1.attn.qkv.weight"])
print("RESULT", json.dumps([diff(named), diff(hf), diff(local), same]))
"""


def test_lookhere_release_loads_from_the_hub_through_every_user_path(hub, tmp_path):  # noqa: F811 - the fixture
    done = client(hub, tmp_path, PUSH_LOOKHERE.replace("{tmp}", str(tmp_path)))
    assert "RESULT" in done.stdout, done.stderr[-3000:]
    *diffs, same = json.loads(done.stdout.split("RESULT", 1)[1])
    assert max(diffs) <= 1e-4 and same, diffs
    card = (tmp_path / "lh90" / "README.md").read_text()
    assert "antofuller/LookHere" in card and "LH_90_weights_and_config.pth" in card
    assert "re-implementation of the official LookHere forward" in card
    config = json.loads((tmp_path / "lh90" / "config.json").read_text())
    assert config["representation_size"] == 384 and config["layer_norm_eps"] == 1e-5
    assert config["pretrained_cfg"]["crop_pct"] == 0.875


@pytest.mark.slow  # a full-size float64 forward: scheduled first (conftest)
def test_every_entry_builds_at_full_size_and_one_converts_exactly():
    """Every published entry builds at its real size (meta device: no memory); one real-size source converts."""
    for entry in pape_hub.list_pretrained():
        model = timm.create_model(entry, device="meta")
        assert model.num_classes == SOURCES[entry].model_args["num_classes"]
    # float64: in float32 the 12 layers' rounding depends on how many threads the BLAS gives a matmul, which
    # varies with the machine's load (seen: 1.5e-4 on a busy machine). What is left is deterministic: Eva's
    # float32 RoPE angles on the 14 x 14 grid through 12 layers (2.4e-5)
    source = randomise(timm.create_model("vit_small_patch16_rope_mixed_224", dtype=torch.float64)).eval()
    model = timm.create_model("vit_s16_rope_mixed.naver_in1k").double().eval()
    model.load_state_dict(convert_state_dict(source.state_dict(), model)[0])
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        assert float((source(x) - model(x)).abs().max()) <= 1e-4


def test_training_seeds_from_a_checkpoint_folder(tmp_path):
    """``--init-from FOLDER``: another encoding gets the backbone and its own position init; the same encoding gets
    everything (a plain fine-tuning start)."""
    from pape_hub.checkpoint import save_checkpoint
    from pape_hub.training import seed_from

    tiny = dict(embed_dim=32, depth=2, num_heads=2, num_classes=3)
    source = timm.create_model("vit_t4_ape", **tiny)
    folder = save_checkpoint(source, tmp_path / "ape")
    other = timm.create_model("vit_t4_pape", **tiny)
    said = seed_from(str(folder), other)
    assert "pos_encoding.position_proj" in said and "pos_encoding.pos_embed" in said
    assert torch.equal(other.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)
    same = timm.create_model("vit_t4_ape", **tiny)
    seed_from(str(folder), same)
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), source.state_dict().values()))
    with pytest.raises(ValueError, match="neither a checkpoint folder nor"):
        seed_from(str(tmp_path / "missing"), same)


def test_transplant_between_pape_hub_models_folds_layer_scale_and_drops_the_head():
    """A converted Naver model (LayerScale, 5 classes) into a PaPE model without LayerScale and with 3 classes."""
    source = converted("vit_s16_rope_mixed.naver_in1k", source_model("vit_s16_rope_mixed.naver_in1k").state_dict(),
                       torch.float32)
    target = timm.create_model("vit_s16_pape", **dict(SMALL, num_classes=3))
    report = transplant(source, target)
    assert "LayerScale gains folded" in report.summary() and "head.weight (other classes)" in report.dropped
    assert "pos_encoding.freqs" in report.dropped and "pos_encoding.position_proj" in report.own_init
    gamma = source.blocks[0].ls1.gamma
    assert torch.allclose(target.blocks[0].attn.proj.weight, source.blocks[0].attn.proj.weight * gamma[:, None])
