"""Evaluate a checkpoint: top-1/top-5, a resolution (or arrow-grid) sweep with and without position
interpolation (PaPE tables 5-7), and the patch-shuffle test (LieRE table 5)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from timm.data import create_transform
from torch.utils.data import DataLoader

from .checkpoint import load_checkpoint
from .data import ARROW_TEST_SEED, ArrowConfig, ArrowDataset, build_data
from .training import evaluate_loader

__all__ = ["evaluate_checkpoint", "git_commit", "plot_sweeps", "shuffle_patches", "write_json"]


def shuffle_patches(images: torch.Tensor, patch: int, generator: torch.Generator) -> torch.Tensor:
    """Permute the patch x patch tiles of each image at random (the content survives, the layout does not)."""
    b, c, h, w = images.shape
    gh, gw = h // patch, w // patch
    tiles = images.reshape(b, c, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c, patch, patch)
    order = torch.stack([torch.randperm(gh * gw, generator=generator) for _ in range(b)])
    tiles = tiles[torch.arange(b)[:, None], order]
    return tiles.reshape(b, gh, gw, c, patch, patch).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


class ShuffledLoader:
    def __init__(self, loader: DataLoader, patch: int, seed: int = 0) -> None:
        self.loader, self.patch, self.generator = loader, patch, torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterable:
        for images, labels in self.loader:
            yield shuffle_patches(images, self.patch, self.generator), labels


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def evaluate_checkpoint(checkpoint: str | Path, dataset: str = "arrows", sizes: list[int] | None = None,
                        resolutions: list[int] | None = None, interpolation: str = "both", split: str = "test",
                        batch_size: int = 256, eval_size: int = 2000, patch_shuffle: bool = True
                        ) -> dict[str, Any]:
    """Sweep one checkpoint. Arrow task: ``sizes`` are grid sizes; image datasets: ``resolutions`` in pixels."""
    model, config = load_checkpoint(checkpoint)
    model.eval()
    meta = config.get("pape_hub", {})
    modes = {"both": [False, True], "on": [True], "off": [False]}[interpolation]
    patch = model.patch_embed.patch_size[0]
    native = model.patch_embed.img_size[0]
    rows: list[dict[str, Any]] = []

    def loaders() -> Iterable[tuple[int, DataLoader]]:
        if dataset == "arrows":
            trained = meta.get("dataset", {}).get("train", {})
            base = {k: trained[k] for k in ("grid", "cell", "num_arrows", "num_letters", "hard_negatives")
                    if k in trained}
            for g in sizes or [base.get("grid", 4)]:
                cfg = ArrowConfig(**{**base, "grid": g})
                yield g, DataLoader(ArrowDataset(eval_size, cfg, seed=ARROW_TEST_SEED), batch_size=batch_size)
        else:
            mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]
            for res in resolutions or [native]:
                tf = create_transform(res, is_training=False, mean=mean, std=std, interpolation="bicubic",
                                      crop_pct=model.pretrained_cfg.get("crop_pct", 0.9))
                data = build_data(dataset, img_size=res, eval_transform=tf, train_transform=tf)
                ds = data.test if split == "test" and data.test is not None else data.val
                yield res, DataLoader(ds, batch_size=batch_size)

    for size, loader in loaders():
        for interp in modes:
            model.position_interpolation = interp
            metrics = evaluate_loader(model, loader)
            rows.append(dict(size=size, interpolation=interp, **metrics))
        if patch_shuffle:
            model.position_interpolation = False
            rows.append(dict(size=size, interpolation=False, patch_shuffle=True,
                             **evaluate_loader(model, ShuffledLoader(loader, patch))))
    return dict(checkpoint=str(checkpoint), architecture=config["architecture"], encoding=meta.get("encoding"),
                dataset=dataset, split=split if dataset != "arrows" else "arrow test seed",
                sweep_unit="arrow grid (cells per side)" if dataset == "arrows" else "image size (px)",
                trained_at=(meta.get("dataset", {}).get("train", {}).get("grid") if dataset == "arrows" else native),
                commit=git_commit(), rows=rows)


def plot_sweeps(results: list[dict[str, Any]], path: str | Path, title: str = "") -> None:
    """Accuracy against sweep size, one line per checkpoint and interpolation mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, res in enumerate(results):
        for interp in (False, True):
            pts = [(r["size"], r["top1"]) for r in res["rows"] if r["interpolation"] == interp
                   and not r.get("patch_shuffle")]
            if pts:
                xs, ys = zip(*pts)
                name = res.get("label") or res.get("encoding") or res["architecture"]
                label = name + (" (interp.)" if interp else "")
                ax.plot(xs, ys, marker="o", ls="--" if interp else "-", label=label, color=colors[index % len(colors)])
    if results:
        ax.axvline(results[0].get("trained_at") or 0, color="gray", lw=0.8, ls=":")
        ax.set_xlabel(results[0]["sweep_unit"])
    ax.set_ylabel("top-1 accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_json(obj: Any, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2))

