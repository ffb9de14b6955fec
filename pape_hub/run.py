"""``python -m pape_hub.run SCRIPT [ARGS...]``: run a script (timm's ``train.py``, ``validate.py``,
``inference.py``, ``benchmark.py``, or any other) with pape_hub's models registered in timm.

timm's scripts build models by name with ``timm.create_model``; a name such as ``vit_t4_pape`` exists once
``import pape_hub`` has run in the process. This runner imports it, then runs the script as ``__main__`` with the
given arguments, exactly as ``python SCRIPT ARGS`` would (``sys.argv[0]`` is the script, its folder is on
``sys.path``). Nothing else changes and no other Python process imports pape_hub::

    python -m pape_hub.run train.py /data/imagenet --model vit_s16_pape --amp --amp-dtype bfloat16
    python -m pape_hub.run validate.py /data/imagenet --model vit_b16_rope_mixed.naver_in1k --pretrained
    torchrun --nproc_per_node 8 -m pape_hub.run train.py /data/imagenet --model vit_b16_pape   # several GPUs

timm's ``train.py`` can also import the package itself: ``python train.py --device-modules pape_hub ...`` (its
option for importing modules before the model is built).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

__all__ = ["main"]

USAGE = "usage: python -m pape_hub.run SCRIPT [ARGS...]   (e.g. timm's train.py, validate.py, inference.py)"


def main(argv: list[str] | None = None) -> None:
    """Import pape_hub, then run ``argv[0]`` as ``__main__`` with ``argv[1:]`` as its arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + (__doc__ or "").split("\n\n")[1], file=sys.stderr)
        raise SystemExit(0 if argv else 2)
    script = Path(argv[0])
    if not script.is_file():
        print(f"pape_hub.run: {script} is not a file; {USAGE}", file=sys.stderr)
        raise SystemExit(2)
    import pape_hub  # noqa: F401 - registers the models with timm (and the transformers face, if installed)

    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.resolve().parent))  # as `python SCRIPT` puts the script's folder first
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
