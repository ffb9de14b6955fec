"""timm's own ``train.py`` and ``validate.py`` with ``--naflex-loader`` on every encoding (native-resolution batches:
images of several shapes, patchified by timm's NaFlex loader, padded per batch), through ``python -m pape_hub.run``.

The scripts live in timm's GitHub repository (the sdist has none), so they are not in this repository and not in the
test suite; give a checkout:

    python scripts/naflex_timm_scripts.py --timm-repo ~/src/pytorch-image-models [--encodings pape,rope]

Each encoding: one epoch of ``train.py --naflex-loader`` on a generated folder of 2 classes x 4 images of random
shapes, then ``validate.py --naflex-loader`` of the checkpoint folder ``pape_hub.save_checkpoint`` writes of the same
architecture. Prints one line per encoding and exits non-zero if any run fails.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

TINY = ["embed_dim=32", "depth=1", "num_heads=2"]


def image_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(4):
            height, width = rng.integers(20, 60, 2)
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


def main(argv: list[str] | None = None) -> int:
    import pape_hub

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timm-repo", type=Path, required=True, help="a checkout of huggingface/pytorch-image-models")
    parser.add_argument("--encodings", default=None, help="comma-separated (default: every encoding)")
    args = parser.parse_args(argv)
    encodings = args.encodings.split(",") if args.encodings else pape_hub.list_encodings()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = image_folder(work / "data")
        for encoding in encodings:
            outcome = check(encoding, args.timm_repo.resolve(), work, data)
            failed += not outcome.startswith("ok")
            print(f"{encoding:16s} {outcome}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
