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


def test_every_user_path_loads_sources_from_the_hub(hub, tmp_path):  # noqa: F811 - the fixture
    entries = ["vit_s16_ape.fb_deit3_in1k", "vit_s16_rope_mixed.naver_in1k", "vit_b16_ape.mae"]
    done = client(hub, tmp_path, PUSH_SOURCES.format(entries=entries) + """
from transformers import AutoModelForImageClassification
from pape_hub.cli import main
out = {}
for entry in logits:
    want = torch.tensor(logits[entry])
    def diff(model):
        with torch.no_grad():
            got = model(x)
        return float((getattr(got, "logits", got) - want).abs().max())
    classes = dict(num_classes=small_args(entry)["num_classes"])  # the small sources' heads: kept, not dropped
    named = timm.create_model(entry, pretrained=True, **small_args(entry), pretrained_cfg_overlay=classes).eval()
    # any name seeded from the source's repo; without LayerScale the gains fold into the layers before them
    overlay = timm.create_model(entry.split(".")[0], pretrained=True, **small_args(entry), pretrained_cfg_overlay=dict(
        classes, hf_hub_id="timm/" + SOURCES[entry].timm_name)).eval()
    args = [f"--set={k}={json.dumps(v)}" for k, v in small_args(entry).items()]
    assert main(["convert", entry, f"{tmp}/{entry}", *args]) == 0
    hf = AutoModelForImageClassification.from_pretrained(f"{tmp}/{entry}").eval() if small_args(entry)[
        "num_classes"] else None
    local = timm.create_model(f"local-dir:{tmp}/{entry}", pretrained=True).eval()
    out[entry] = [diff(named), diff(overlay), diff(hf) if hf else 0.0, diff(local)]
print("RESULT", json.dumps(out))
""".replace("{tmp}", str(tmp_path)))
    assert "RESULT" in done.stdout, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    for entry, diffs in result.items():
        assert max(diffs) <= 1e-4, (entry, diffs)
    card = (tmp_path / "vit_s16_rope_mixed.naver_in1k" / "README.md").read_text()
    assert "timm/vit_small_patch16_rope_mixed_224.naver_in1k" in card and "float64" in card
    assert "license: apache-2.0" in card and "base_model: timm/vit_small_patch16_rope_mixed_224.naver_in1k" in card
    assert "license: cc-by-nc-4.0" in (tmp_path / "vit_b16_ape.mae" / "README.md").read_text()


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
