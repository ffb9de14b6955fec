"""timm's own ``train.py`` and ``validate.py`` with ``--naflex-loader`` on every encoding (native-resolution batches:
images of several shapes, patchified by timm's NaFlex loader, padded per batch), through ``python -m pape_hub.run``.

The scripts live in timm's GitHub repository (the sdist has none), so they are not in this repository and not in the
test suite; give a checkout:

    python scripts/naflex_timm_scripts.py --timm-repo ~/src/pytorch-image-models [--encodings pape,rope]

Each encoding: one epoch of ``train.py --naflex-loader`` on a generated folder of 2 classes x 4 images of random
shapes, then ``validate.py --naflex-loader`` of the checkpoint folder ``pape_hub.save_checkpoint`` writes of the same
architecture. Prints one line per encoding and exits non-zero if any run fails.

``--against-alone ENCODING:SEQ_LEN:BATCH ...`` instead runs ``validate.py --naflex-loader`` on ViT-S/16 of each
encoding (weights perturbed away from init, 16 images of 60-400 px) at that batch and at batch 1, and compares the
mean loss it prints: a padded batch must score each image as it scores alone. Sizes that reach a path of their own,
e.g. ``liere:128:4 liere8:256:16``: LieRE's rotations taken in blocks from one table a layer (per-sample coordinates
over ``STATE_BYTES`` a layer), which a batch of one never takes.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

TINY = ["embed_dim=32", "depth=1", "num_heads=2"]


def image_folder(root: Path, per_class: int = 4, sides: tuple[int, int] = (20, 60)) -> Path:
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            height, width = rng.integers(*sides, 2)
            Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def run(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pape_hub.run", str(script), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=900)


def check(encoding: str, timm_repo: Path, work: Path, data: Path) -> str:
    import timm

    import pape_hub

    train = run(timm_repo / "train.py", str(data), "--train-split", "", "--val-split", "", "--model",
                f"vit_t4_{encoding}", "--model-kwargs", *TINY, "--num-classes", "2", "--naflex-loader",
                "--naflex-train-seq-lens", "32", "64", "--naflex-max-seq-len", "64", "-b", "4", "--epochs", "1",
                "--workers", "0", "--device", "cpu", "--output", str(work / "runs"), "--experiment", encoding,
                cwd=work)
    if train.returncode:
        return f"train.py failed: {train.stderr.strip().splitlines()[-1]}"
    model = timm.create_model(f"vit_t4_{encoding}", num_classes=2, **{k: int(v) for k, v in
                                                                     (a.split("=") for a in TINY)})
    folder = pape_hub.save_checkpoint(model, work / f"ckpt_{encoding}", overwrite=True)
    valid = run(timm_repo / "validate.py", str(data), "--model", f"local-dir:{folder}", "--naflex-loader",
                "--naflex-max-seq-len", "64", "--batch-size", "4", "--workers", "0", "--device", "cpu", cwd=work)
    if valid.returncode:
        return f"validate.py failed: {valid.stderr.strip().splitlines()[-1]}"
    losses = [line for line in train.stdout.splitlines() + train.stderr.splitlines() if "Train:" in line]
    top1 = next((line.strip() for line in valid.stdout.splitlines() + valid.stderr.splitlines() if "Acc@1" in line),
                "?")
    return f"ok: {losses[-1].split('Loss:')[1].split(')')[0].strip()}) train loss; validate {top1}"


def mean_loss(validate: subprocess.CompletedProcess) -> str:
    """The running mean loss validate.py prints last (``Loss: 0.7012 (0.6886)``), as printed."""
    means = re.findall(r"Loss:\s+\S+\s+\(\s*(\S+)\)", validate.stdout + validate.stderr)
    return means[-1] if means else "?"


def against_alone(spec: str, timm_repo: Path, work: Path, data: Path) -> str:
    """validate.py --naflex-loader at ``spec``'s batch and at batch 1: the same mean loss, or a failure."""
    import timm
    import torch

    import pape_hub

    encoding, seq_len, batch = spec.split(":")
    torch.manual_seed(0)
    model = timm.create_model(f"vit_s16_{encoding}", num_classes=2)
    with torch.no_grad():  # away from init, where attention is nearly uniform and positions barely matter
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    folder = pape_hub.save_checkpoint(model, work / f"alone_{encoding}", overwrite=True)
    losses = []
    for size in (batch, "1"):
        valid = run(timm_repo / "validate.py", str(data), "--model", f"local-dir:{folder}", "--naflex-loader",
                    "--naflex-max-seq-len", seq_len, "--batch-size", size, "--workers", "0", "--device", "cpu",
                    "--log-freq", "1", cwd=work)
        if valid.returncode:
            return f"validate.py at batch {size} failed: {valid.stderr.strip().splitlines()[-1]}"
        losses.append(mean_loss(valid))
    outcome = "ok" if losses[0] == losses[1] != "?" else "differs"
    return f"{outcome}: mean loss {losses[0]} at batch {batch}, {losses[1]} one image at a time (max_seq_len {seq_len})"


def main(argv: list[str] | None = None) -> int:
    import pape_hub

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timm-repo", type=Path, required=True, help="a checkout of huggingface/pytorch-image-models")
    parser.add_argument("--encodings", default=None, help="comma-separated (default: every encoding)")
    parser.add_argument("--against-alone", nargs="+", metavar="ENCODING:SEQ_LEN:BATCH", default=None,
                        help="validate ViT-S/16 of each encoding at that batch and one image at a time (see above)")
    args = parser.parse_args(argv)
    encodings = args.encodings.split(",") if args.encodings else pape_hub.list_encodings()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.against_alone:
            data = image_folder(work / "data", per_class=8, sides=(60, 400))
            checks = [(spec, lambda spec=spec: against_alone(spec, args.timm_repo.resolve(), work, data))
                      for spec in args.against_alone]
        else:
            data = image_folder(work / "data")
            checks = [(encoding, lambda encoding=encoding: check(encoding, args.timm_repo.resolve(), work, data))
                      for encoding in encodings]
        for name, run_check in checks:
            outcome = run_check()
            failed += not outcome.startswith("ok")
            print(f"{name:16s} {outcome}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
