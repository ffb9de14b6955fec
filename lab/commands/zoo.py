"""Images and video: each model's parameters are counted and a forward runs at two resolutions (video: two frame
sizes of the nominal clip)."""

from __future__ import annotations

import argparse
import time

import timm
import torch

from pape_hub.encodings import encoding_class, list_encodings
from pape_hub.models import list_pape_models, model_args_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="t,s,b", help="comma-separated model sizes from t,s,b,l (default t,s,b)")
    parser.add_argument("--encodings", default="all", help="comma-separated encoding names, or 'all'")
    parser.add_argument("--families", default="vit,vivit", help="comma-separated model families: vit, vivit")
    parser.add_argument("--scale", type=float, default=1.5, help="second resolution = native x scale (rounded to "
                        "the patch size)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def encoding_rows() -> list[str]:
    """Markdown table of the registered encodings (mechanism, fused, parameters at ViT-B/16)."""
    rows = ["| name | paper | mechanism | fused attention | position parameters (ViT-B/16) |", "|---|---|---|---|---|"]
    for name in list_encodings():
        with torch.device("meta"):
            model = timm.create_model(f"vit_b16_{name}")
        enc = model.pos_encoding
        n = sum(p.numel() for p in enc.parameters())
        cls, _ = encoding_class(name)
        rows.append(f"| `{name}` | {cls.paper} | {', '.join(enc.mechanisms) or '-'} | {'yes' if enc.fused else 'no'} "
                    f"| {n:,} |")
    return rows


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = set(args.sizes.split(","))
    encodings = list_encodings() if args.encodings == "all" else args.encodings.split(",")
    print("\n".join(encoding_rows()), "\n", flush=True)
    header = f"{'model':<24} {'params':>12} {'pos params':>11} {'res 1':>6} {'ms':>8} {'res 2':>6} {'ms':>8}  ok"
    print(header, "\n" + "-" * len(header), flush=True)
    failures = 0
    families = args.families.split(",")
    for name in (n for family in families for n in list_pape_models(family)):
        size_patch, _, enc = name.split("_", 1)[1].partition("_")  # vit_b16_pape -> b16, pape
        if size_patch[0] not in sizes or enc not in encodings:
            continue
        torch.manual_seed(0)
        model = timm.create_model(name).eval()
        args_ = model_args_for(name)
        patch, native = model.patch_embed.patch_size[-1], args_["img_size"]
        clip = (args_["num_frames"],) if "num_frames" in args_ else ()  # video: (B, C, T, H, W)
        second = max(patch, round(native * args.scale / patch) * patch)
        total = sum(p.numel() for p in model.parameters())
        pos = sum(p.numel() for p in model.pos_encoding.parameters())
        cells, ok = [], True
        for res in (native, second):
            x = torch.randn(1, 3, *clip, res, res)
            start = time.perf_counter()
            with torch.inference_mode():
                out = model(x)
            cells += [f"{res:>6}", f"{(time.perf_counter() - start) * 1e3:>8.1f}"]
            ok &= tuple(out.shape) == (1, model.num_classes) and bool(out.isfinite().all())
        failures += not ok
        print(f"{name:<24} {total:>12,} {pos:>11,} {' '.join(cells)}  {'yes' if ok else 'NO'}", flush=True)
    print(f"\n{failures} model(s) failed" if failures else "\nall models built and ran at both resolutions")
    return 1 if failures else 0
