"""Push checkpoint folders, then load each back by repo id from both faces and compare with the local folder.

``python -m pape_hub.hub.roundtrip ITEMS.json`` with ``ITEMS.json`` a list of ``[checkpoint folder, repo id]``;
the Hub is the one ``HF_ENDPOINT`` / ``HF_TOKEN`` name. Prints one JSON line: per repo the commit URL and whether
``timm.create_model("hf-hub:<repo>")`` and ``AutoModelForImageClassification.from_pretrained("<repo>")`` give logits
bit-identical to the local folder's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def roundtrip(checkpoint: Path, repo_id: str) -> dict[str, Any]:
    import timm
    import torch
    from transformers import AutoModelForImageClassification

    from . import push_checkpoint

    url = push_checkpoint(checkpoint, repo_id)
    local = timm.create_model(f"local-dir:{checkpoint}", pretrained=True).eval()
    from_timm = timm.create_model(f"hf-hub:{repo_id}", pretrained=True).eval()
    from_hf = AutoModelForImageClassification.from_pretrained(repo_id).eval()
    channels, size = local.patch_embed.proj.in_channels, local.patch_embed.img_size
    x = torch.randn(2, channels, *size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = local(x)
        return dict(url=url, timm_identical=bool(torch.equal(from_timm(x), reference)),
                    transformers_identical=bool(torch.equal(from_hf(x).logits, reference)))


def main(path: str) -> int:
    import pape_hub  # noqa: F401 - registers the models with timm and transformers

    items = json.loads(Path(path).read_text())
    results = {repo_id: roundtrip(Path(checkpoint), repo_id) for checkpoint, repo_id in items}
    print(json.dumps(results))
    return 0 if all(r["timm_identical"] and r["transformers_identical"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
