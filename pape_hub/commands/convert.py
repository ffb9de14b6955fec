"""The source's own files are downloaded (``HF_ENDPOINT`` honoured), converted exactly as ``timm.create_model(NAME,
pretrained=True)`` does, checked against the source built by its own timm code (a release timm does not list,
LookHere's: by an independent re-implementation of its forward) - the largest logit difference, float32 and float64,
goes into the card - and saved.

Examples:
    pape-hub convert vit_b16_rope_mixed.naver_in1k checkpoints/vit_b16_rope_mixed_naver
    pape-hub convert vit_s16_ape.fb_deit3_in1k out/deit3_s --set depth=2 --set embed_dim=64   # a small test copy
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a converted entry, NAME.TAG (pape_hub.list_pretrained())")
    parser.add_argument("output", help="the checkpoint folder to write")
    parser.add_argument("--set", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="a model constructor argument for source and copy alike (JSON value), e.g. depth=2")
    parser.add_argument("--no-verify", action="store_true", help="skip the comparison with the source's own code")
    parser.add_argument("--overwrite", action="store_true", help="write into an existing folder that holds other "
                        "files too, replacing only files pape_hub wrote there (a checkpoint pape_hub wrote is always "
                        "replaced whole)")


def label_names(num_classes: int) -> list[str] | None:
    """ImageNet's class descriptions for a 1000- or 21843-class head (timm's ImageNetInfo), else None."""
    from timm.data import ImageNetInfo

    subsets = {1000: "imagenet-1k", 21843: "imagenet-21k-goog"}
    return ImageNetInfo(subsets[num_classes]).label_descriptions() if num_classes in subsets else None


def run(args: argparse.Namespace) -> int:
    import timm

    from ..card import write_model_card
    from ..checkpoint import check_checkpoint_target, save_checkpoint
    from ..models.pretrained import SOURCES, compare_with_source, files_overlay

    if args.source not in SOURCES:
        raise ValueError(f"{args.source!r} is not a converted public checkpoint; one of: {', '.join(SOURCES)}")
    check_checkpoint_target(args.output, args.overwrite)  # before downloading anything
    kwargs = dict(args.set)  # describes the source's files too (a small test copy's size and head)
    if kwargs:  # a --set the model cannot take is named before any download
        try:
            timm.create_model(args.source, device="meta", **kwargs)
        except (TypeError, ValueError) as err:
            given = " ".join(f"--set {k}={json.dumps(v)}" for k, v in args.set)
            raise ValueError(f"{given}: not a constructor argument {args.source} takes ({err}); the arguments are "
                             "timm's and pape_hub's VisionTransformer's, e.g. --set depth=2") from err
    model = timm.create_model(args.source, pretrained=True, pretrained_cfg_overlay=files_overlay(kwargs),
                              **kwargs).eval()
    check = None if args.no_verify else compare_with_source(model, args.source, **kwargs)
    cfg = model.pretrained_cfg
    converted_from = dict(timm_name=SOURCES[args.source].timm_name, file=cfg.get("hf_hub_filename"),
                          hf_hub_id=cfg["hf_hub_id"],
                          license=cfg.get("license"), paper=cfg.get("paper_name"), entry=args.source, check=check,
                          reported=SOURCES[args.source].reported or None)
    # the source's mean, std, crop and interpolation travel in the model's pretrained cfg, which the save writes
    out = save_checkpoint(model, Path(args.output), label_names=label_names(model.num_classes),
                          extra=dict(converted_from=converted_from), overwrite=args.overwrite)
    write_model_card(out)
    difference = (f"; logits differ from the source's by at most {check['max_abs_diff_float32']:.2e} (float32), "
                  f"{check['max_abs_diff_float64']:.2e} (float64)" if check else "")
    print(f"wrote {out} from {converted_from['hf_hub_id']}{difference}")
    return 0
