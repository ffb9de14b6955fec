"""Full-size conversion check: each new source family at its real size with non-trivial random weights, converted
by ``convert_state_dict`` and compared with the source built by its own code (timm's DINOv3; LookHere's stand-in,
``pape_hub.models.lookhere_reference``) in float64 and float32. The README's full-size figures come from this
(about a minute on 2 CPU cores; the test suite checks the same conversions at a small size).

    python scripts/conversion_check.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import timm
import torch

import pape_hub  # noqa: F401 - registers the models
from pape_hub.models.lookhere_reference import LookHereReference
from pape_hub.models.pretrained import convert_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_pretrained import LH90, randomise  # noqa: E402 - the tests' non-trivial weights

CASES = {  # entry -> (the source at full size, input sizes)
    "vit_b16_lookhere.lh90_in1k": (lambda: LookHereReference(LH90), (224, 384)),
    "vit_s16_rope_dinov3.lvd1689m": (lambda: timm.create_model("vit_small_patch16_dinov3"), (256, 384)),
    "vit_b16_rope_dinov3.lvd1689m": (lambda: timm.create_model("vit_base_patch16_dinov3"), (256, 384)),
    "vit_s16_rope_dinov3.lvd1689m_plus": (lambda: timm.create_model("vit_small_plus_patch16_dinov3"), (256,)),
}


@torch.no_grad()
def main() -> int:
    for entry, (build, sizes) in CASES.items():
        source = randomise(build().double()).eval()
        state = source.state_dict()
        file = {"config": dict(LH90), "weights": state} if isinstance(source, LookHereReference) else state
        model = timm.create_model(entry).double().eval()
        model.load_state_dict(convert_state_dict(file, model)[0])
        for size in sizes:
            x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
            f64 = float((source(x) - model(x)).abs().max())
            f32 = float((source.float()(x.float()) - model.float()(x.float())).abs().max())
            source.double(), model.double()
            print(f"{entry} at {size} px: max |logit difference| {f64:.1e} (float64), {f32:.1e} (float32)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
