r"""The cost of native-resolution batches: the same images as a batch of square images (one grid shared by the
batch, the fast path), as timm's NaFlex dict of the same square images (per-token positions, nothing padded), and
as a NaFlex batch of images at other aspect ratios padded to one length, per encoding, with timm's NaFlexViT as the
baseline of each form. Medians of interleaved rounds in one process (``torch.inference_mode``).

Each form is reported as time per forward and as valid tokens per second, and against the square batch of the same
model: per-token positions cost ``naflex_square / square``; padding costs ``(padded / square) x (square tokens /
valid tokens)`` per valid token.

Example:
    python -m lab padding --output results/padding_vit_s16_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path
from typing import Any

import timm
import torch
from timm.data.naflex_dataset import NaFlexCollator
from timm.data.naflex_transforms import get_image_size_for_seq, patchify_image

from pape_hub.encodings import list_encodings

from ..provenance import provenance
from .bench import TIMM_SIZE, interleaved

#: the padded batch's aspect ratios (height / width): each image is as large as the square images' token count
#: allows (timm's ``get_image_size_for_seq``, as its NaFlex loader resizes), all padded to that count
PADDED_ASPECTS = (1 / 2, 2, 1, 3 / 4, 4 / 3, 1 / 3, 3, 9 / 10)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", default="s", choices=list(TIMM_SIZE), help="ViT size (default s)")
    parser.add_argument("--resolution", type=int, default=224, help="the square images' side (default 224)")
    parser.add_argument("--encodings", default="all", help="comma-separated encodings, or 'all'")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--output", default="outputs/bench/padding.json", help="the results JSON")


def naflex_batch(images: list[torch.Tensor], patch: int, length: int) -> dict[str, torch.Tensor]:
    """timm's collated NaFlex dict of ``images`` (each (C, H, W)), padded to ``length`` tokens."""
    samples = []
    for image in images:
        patches, coord, valid = patchify_image(image, (patch, patch))
        samples.append((dict(patches=patches, patch_coord=coord, patch_valid=valid), 0))
    batch, _ = NaFlexCollator(length)(samples)
    return {k: v for k, v in batch.items() if k != "seq_len"}


def inputs(res: int, patch: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(square batch (8, 3, res, res), the same as a NaFlex dict, images at :data:`PADDED_ASPECTS` padded to the
    square images' token count)."""
    torch.manual_seed(0)
    square = torch.randn(len(PADDED_ASPECTS), 3, res, res)
    tokens = (res // patch) ** 2
    sizes = [get_image_size_for_seq((round(1000 * aspect), 1000), patch, tokens)[1] for aspect in PADDED_ASPECTS]
    shaped = [torch.randn(3, h, w) for h, w in sizes]
    return square, naflex_batch(list(square), patch, tokens), naflex_batch(shaped, patch, tokens)


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as pape-hub train and the bench do on CPU
    encodings = list_encodings() if args.encodings == "all" else args.encodings.split(",")
    width, heads = {"t": (192, 3), "s": (384, 6), "b": (768, 12), "l": (1024, 16)}[args.size]
    depth = 24 if args.size == "l" else 12
    # timm registers NaFlexViT at base size and up; the same architecture at the ViT size asked for
    models = {"timm_naflexvit": timm.create_model("naflexvit_base_patch16_gap", embed_dim=width, num_heads=heads,
                                                  depth=depth)}
    models.update({enc: timm.create_model(f"vit_{args.size}16_{enc}") for enc in encodings})
    patch = 16
    square, naflex_square, padded = inputs(args.resolution, patch)
    valid = {"square": square.shape[0] * (args.resolution // patch) ** 2,
             "naflex_square": int(naflex_square["patch_valid"].sum()), "padded": int(padded["patch_valid"].sum())}
    forms = {"square": square, "naflex_square": naflex_square, "padded": padded}
    calls = {}
    for key, model in models.items():
        model.eval()
        for form, x in forms.items():
            calls[(key, form)] = (lambda m=model, x=x: m(x))
    with torch.inference_mode():
        times = interleaved({f"{k}|{f}": fn for (k, f), fn in calls.items()}, args.repeats, args.warmup,
                            lambda: None)
    rows: dict[str, dict[str, Any]] = {}
    for key in models:
        med = {form: statistics.median(times[f"{key}|{form}"]) for form in forms}
        per_valid_token = {form: med[form] / valid[form] for form in forms}
        rows[key] = dict(**{f"{form}_ms": med[form] * 1e3 for form in forms},
                         **{f"{form}_tokens_s": 1 / per_valid_token[form] for form in forms},
                         per_token_ratio=med["naflex_square"] / med["square"],
                         padded_ratio_per_valid_token=per_valid_token["padded"] / per_valid_token["square"])
    report = dict(provenance=provenance("bench"), device=f"{platform.processor() or platform.machine()} CPU, "
                  f"{torch.get_num_threads()} threads", dtype="torch.float32", torch=torch.__version__,
                  timm=timm.__version__, size=args.size, resolution=args.resolution, repeats=args.repeats,
                  padded_aspects=list(PADDED_ASPECTS), valid_tokens=valid,
                  padded_length=padded["patch_valid"].shape[1], rows=rows)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))
    print(f"{'model':<18} {'square ms':>10} {'naflex ms':>10} {'padded ms':>10} {'per-token':>10} {'padded/tok':>11}")
    for key, row in rows.items():
        print(f"{key:<18} {row['square_ms']:>10.1f} {row['naflex_square_ms']:>10.1f} {row['padded_ms']:>10.1f} "
              f"{row['per_token_ratio']:>10.3f} {row['padded_ratio_per_valid_token']:>11.3f}")
    print(f"valid tokens: {valid}; wrote {output}")
    return 0
