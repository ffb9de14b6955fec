"""Every registered model builds, trains a step, runs at a second resolution and round-trips safetensors;
the ViT behaves like a timm model (the checks of timm's generic model tests)."""

from __future__ import annotations

import pytest
import timm
import timm.optim
import torch
from safetensors.torch import load_file, save_file
from timm.models import group_parameters
from timm.optim import param_groups_layer_decay

import pape_hub
from pape_hub.models import list_pape_models, model_args_for

TINY = dict(embed_dim=64, depth=3, num_heads=4)  # head dim 16
ALL_MODELS = list_pape_models("vit")  # the video models: tests/test_video.py
ENCODINGS = pape_hub.list_encodings()


def tiny(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **{**TINY, **kwargs})


def batch(model: torch.nn.Module, size: int | None = None, n: int = 2) -> torch.Tensor:
    size = size or model.patch_embed.img_size[0]
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", ALL_MODELS)
def test_registered_model_trains_and_changes_resolution(name, tmp_path):
    patch = model_args_for(name)["patch_size"]
    kwargs = dict(img_size=32, patch_size=patch) if patch == 16 else {}  # keep 224 models cheap in CI
    model = tiny(name, **kwargs)
    out = model(batch(model))
    assert out.shape == (2, model.num_classes)
    out.logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not missing, f"parameters without gradient: {missing}"

    model.eval()
    bigger = model.patch_embed.img_size[0] + 2 * patch
    with torch.no_grad():
        assert model(batch(model, bigger)).isfinite().all()

    path = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(path))
    clone = tiny(name, **kwargs)
    clone.load_state_dict(load_file(str(path)))
    clone.eval()
    for key, value in model.state_dict().items():
        assert torch.equal(clone.state_dict()[key], value), key
    x = batch(model)
    with torch.no_grad():
        assert torch.equal(clone(x), model(x))


@pytest.mark.parametrize("size,embed_dim,depth,heads", [("t", 192, 12, 3), ("s", 384, 12, 6), ("b", 768, 12, 12),
                                                        ("l", 1024, 24, 16)])
def test_full_size_models_on_meta_device(size, embed_dim, depth, heads):
    with torch.device("meta"):
        model = timm.create_model(f"vit_{size}16_pape")
    assert (model.embed_dim, len(model.blocks), model.blocks[0].attn.num_heads) == (embed_dim, depth, heads)
    if size == "b":
        n_params = sum(p.numel() for p in model.parameters())
        base = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("pos_encoding"))
        assert 86.0e6 < base < 86.9e6  # ViT-B/16 without position parameters (86.4M with APE)
        assert n_params - base == 12 * (12 * 50 * 2 + 2 * 12 * 50 * 768)  # W_p, W_a, W_b per layer


def test_vit_b16_pape_one_forward_at_224():
    torch.manual_seed(0)
    model = timm.create_model("vit_b16_pape").eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 224, 224))
    assert out.shape == (1, 1000) and out.isfinite().all()


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_timm_feature_api(encoding):
    model = tiny(f"vit_t4_{encoding}").eval()
    x = batch(model)
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.shape == (2, 1 + 64, 64)
        assert model.forward_head(feats, pre_logits=True).shape == (2, 64)
        final, inter = model.forward_intermediates(x, indices=[0, 2])
        assert [t.shape for t in inter] == [(2, 64, 8, 8)] * 2
        torch.testing.assert_close(final, feats)
        nlc = model.forward_intermediates(x, indices=1, output_fmt="NLC", intermediates_only=True)
        assert nlc[0].shape == (2, 64, 64)


def test_features_only_and_prune():
    model = timm.create_model("vit_t4_pape", features_only=True, out_indices=(1, 2), **TINY)
    outs = model(torch.randn(1, 3, 32, 32))
    assert [o.shape for o in outs] == [(1, 64, 8, 8), (1, 64, 8, 8)]
    assert model.feature_info.channels() == [64, 64]
    full = tiny("vit_t4_rope")
    full.prune_intermediate_layers(indices=[0])
    assert len(full.blocks) == 1 and full.num_classes == 0


def test_reset_classifier_pooling_and_group_matcher():
    model = tiny("vit_t4_rope_mixed", global_pool="avg")
    assert model(batch(model)).shape == (2, 10)
    model.reset_classifier(5)
    assert model(batch(model)).shape == (2, 5)
    model.reset_classifier(0)
    assert model(batch(model)).shape == (2, 64)
    no_cls = tiny("vit_t4_alibi", class_token=False, global_pool="avg")
    assert no_cls.num_prefix_tokens == 0 and no_cls(batch(no_cls)).shape == (2, 10)
    with pytest.raises(ValueError, match="class_token"):
        tiny("vit_t4_alibi", class_token=False, global_pool="token")
    groups = group_parameters(model, model.group_matcher())
    assert sum(len(names) for names in groups.values()) == len(list(model.parameters()))
    # layer-wise lr decay (timm's fine-tuning recipe) reads the same matcher
    decay_groups = param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.75)
    assert sum(len(g["params"]) for g in decay_groups) == len(list(model.parameters()))


def test_no_weight_decay_names_position_parameters():
    for enc, expected in [("rope_mixed", "pos_encoding.freqs"), ("ape", "pos_encoding.pos_embed"),
                          ("liere8", "pos_encoding.generators"), ("sape2_ape", "pos_encoding.absolute.pos_embed")]:
        model = tiny(f"vit_t4_{enc}")
        nwd = model.no_weight_decay()
        assert expected in nwd and "cls_token" in nwd
        names = dict(model.named_parameters())
        assert all(n in names for n in nwd if n != "cls_token" or model.cls_token is not None)
    model = tiny("vit_t4_rope_mixed")
    groups = timm.optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05).param_groups
    no_decay = [g for g in groups if g["weight_decay"] == 0]
    assert any(p is model.pos_encoding.freqs for g in no_decay for p in g["params"])


@pytest.mark.parametrize("encoding", ["pape", "liere8", "sape2", "rope_mixed"])
def test_grad_checkpointing_matches(encoding):
    model = tiny(f"vit_t4_{encoding}")
    x = batch(model)
    ref = model(x)
    ref.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    out = model(x)
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6, msg=n)


def test_set_input_size_resamples_ape_and_moves_interpolation_reference():
    model = tiny("vit_t4_ape").eval()
    model.set_input_size(img_size=48)
    assert model.pos_encoding.pos_embed.shape == (1, 1 + 144, 64)
    assert model.patch_embed.img_size == (48, 48) and model.pos_encoding.ctx.grid_size == (12, 12)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 48, 48)).shape == (1, 10)


def test_fused_and_eager_attention_agree():
    for enc in ENCODINGS:
        model = tiny(f"vit_t4_{enc}").eval()
        x = batch(model, 40)
        with torch.no_grad():
            fused = model(x)
            for block in model.blocks:
                block.attn.fused_attn = False
            eager = model(x)
        torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-5, msg=enc)


def test_position_interpolation_option():
    model = tiny("vit_t4_sincos", position_interpolation=True).eval()
    x = batch(model, 64)
    pos = model.positions((16, 16), x.device)
    assert pos.scale == (0.5, 0.5) and pos.coords.max().item() == pytest.approx(7.5)
    plain = tiny("vit_t4_sincos").eval()
    with torch.no_grad():
        assert not torch.allclose(model(x), plain(x))
        torch.testing.assert_close(model(batch(model)), plain(batch(model)))  # same at the training grid


def test_inference_caches_and_training_does_not():
    model = tiny("vit_t4_liere8").eval()
    with torch.no_grad():
        model(batch(model))
    assert len(model.pos_encoding._cache) == 1
    cached = next(iter(model.pos_encoding._cache.values()))
    with torch.no_grad():
        model.pos_encoding.generators.add_(0.1)  # an optimizer step bumps the version: the cache is stale
        model(batch(model))
    assert next(iter(model.pos_encoding._cache.values())) is not cached


@pytest.mark.parametrize("encoding", ["pape", "alibi", "liere8", "sincos"])
def test_training_after_inference_mode_evaluation(encoding):
    """Caches filled under inference_mode must not leak inference tensors into a later training step."""
    model = tiny(f"vit_t4_{encoding}")
    with torch.inference_mode():
        model.eval()(batch(model))
    model.train()(batch(model)).sum().backward()


class TestBadInput:
    def test_unknown_encoding_lists_valid_ones(self):
        with pytest.raises(ValueError, match="unknown position encoding 'pope'.*pape_ri"):
            pape_hub.VisionTransformer(position_encoding="pope", **TINY)

    def test_unknown_model_kwargs_rejected(self):
        with pytest.raises(TypeError):
            timm.create_model("vit_t4_pape", no_such_option=1)

    def test_unknown_encoding_kwargs_rejected(self):
        with pytest.raises(TypeError, match="num_parabolas"):
            tiny("vit_t4_pape", position_encoding_kwargs={"num_parabola": 8})

    def test_image_size_not_divisible(self):
        model = tiny("vit_t4_rope")
        with pytest.raises(ValueError, match="not divisible by the patch size 4x4"):
            model(torch.randn(1, 3, 30, 32))

    def test_wrong_channels(self):
        with pytest.raises(ValueError, match="expected 3 input channels"):
            tiny("vit_t4_rope")(torch.randn(1, 1, 32, 32))

    @pytest.mark.parametrize("encoding", ["lookhere"])
    def test_encodings_without_3d_definition(self, encoding):
        ctx = pape_hub.EncodingContext(64, 4, 3, (2, 4, 4), 1)
        with pytest.raises(ValueError, match="defined for 2-D \\(images\\) inputs only.*3-D"):
            pape_hub.create_encoding(encoding, ctx)

    def test_static_size_model_rejects_other_sizes(self):
        model = tiny("vit_t4_rope", dynamic_img_size=False)
        with pytest.raises(ValueError, match="dynamic_img_size=False"):
            model(torch.randn(1, 3, 48, 48))
