"""Where the main job publishes (:class:`HubTarget`: the Hub your token points at, or an endpoint started on
127.0.0.1, :mod:`lab.local_hub`, when no token is configured), and the round trip it checks.

``python -m lab.publish ITEMS.json`` with ``ITEMS.json`` a list of ``[checkpoint folder, repo id]``: pushes each, then
loads it back by repo id from both faces; the Hub is the one ``HF_ENDPOINT`` / ``HF_TOKEN`` name. Prints one JSON
line: per repo the commit URL and whether ``timm.create_model("hf-hub:<repo>")`` and
``AutoModelForImageClassification.from_pretrained("<repo>")`` (point and event models:
``AutoModelForSequenceClassification``) give logits bit-identical to the local folder's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pape_hub.hub import hub_token

from . import REPOSITORY


@dataclass
class HubTarget:
    """Where the main job publishes. ``kind`` is ``"real"`` (the configured endpoint, with your token) or
    ``"local"`` (an endpoint on 127.0.0.1 started for the session, stored in a temporary folder)."""

    kind: str
    namespace: str
    endpoint: str = ""
    env: dict[str, str] = field(default_factory=dict)
    server: Any = None

    @classmethod
    def resolve(cls, mode: str, namespace: str | None = None) -> HubTarget:
        from huggingface_hub import HfApi, constants

        if mode not in ("auto", "real", "local"):
            raise ValueError(f"hub mode must be auto, real or local, got {mode!r}")
        token = hub_token()
        if mode == "real" or (mode == "auto" and token):
            try:
                user = HfApi(token=token).whoami()["name"] if token else None
            except Exception as err:  # noqa: BLE001 - any failure here means "not reachable with this token"
                if mode == "real":
                    raise ConnectionError(f"--hub real: the Hub at {constants.ENDPOINT} did not accept the token "
                                          f"({type(err).__name__}: {err})") from err
                print(f"note: a Hub token is configured but {constants.ENDPOINT} did not answer ({type(err).__name__})"
                      "; publishing to a local Hub endpoint instead", flush=True)
            else:
                if user is None:
                    raise PermissionError("--hub real needs a token: set HF_TOKEN or run `hf auth login`")
                return cls("real", namespace or user, constants.ENDPOINT)
        return cls("local", namespace or "pape-hub")

    @contextmanager
    def session(self) -> Iterator[HubTarget]:
        """Start (and afterwards stop) the local endpoint; nothing to do for the real Hub."""
        if self.kind != "local":
            yield self
            return
        from .local_hub import LocalHub

        with tempfile.TemporaryDirectory(prefix="pape_hub_local_hub_") as tmp:
            self.server = LocalHub(Path(tmp) / "data").start()
            self.endpoint = self.server.url
            self.env = dict(self.server.client_env(), HF_HOME=str(Path(tmp) / "hf_home"))
            try:
                yield self
            finally:
                self.server.stop()
                self.server = None

    def publish(self, items: list[tuple[Path, str]]) -> dict[str, dict[str, Any]]:
        """Push each (checkpoint folder, repo id) and load it back by repo id through timm and transformers, in a
        fresh process whose ``huggingface_hub`` points at this target (it reads the endpoint at import time)."""
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
            json.dump([[str(c), r] for c, r in items], fh)
        try:
            env = dict(os.environ, **self.env, PYTHONUNBUFFERED="1")
            done = subprocess.run([sys.executable, "-m", "lab.publish", fh.name], capture_output=True, text=True,
                                  env=env, timeout=1800, cwd=REPOSITORY)
        finally:
            os.unlink(fh.name)
        if done.returncode != 0:
            raise RuntimeError(f"publishing to {self.endpoint} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def roundtrip(checkpoint: Path, repo_id: str) -> dict[str, Any]:
    import timm
    import torch
    from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

    from pape_hub.hub import push_checkpoint
    from pape_hub.models.free_tokens import FreeTokenTransformer

    url = push_checkpoint(checkpoint, repo_id)
    local = timm.create_model(f"local-dir:{checkpoint}", pretrained=True).eval()
    from_timm = timm.create_model(f"hf-hub:{repo_id}", pretrained=True).eval()
    generator = torch.Generator().manual_seed(0)
    if isinstance(local, FreeTokenTransformer):  # points or events: a padded batch and its mask
        from_hf = AutoModelForSequenceClassification.from_pretrained(repo_id).eval()
        x, valid = free_token_inputs(local, generator)
        with torch.no_grad():
            reference = local(x, valid)
            face = from_hf(x, attention_mask=valid.long()).logits
            return dict(url=url, timm_identical=bool(torch.equal(from_timm(x, valid), reference)),
                        transformers_identical=bool(torch.equal(face, reference)))
    from_hf = AutoModelForImageClassification.from_pretrained(repo_id).eval()
    channels, size = local.patch_embed.proj.in_channels, local.patch_embed.img_size
    x = torch.randn(2, channels, *size, generator=generator)
    with torch.no_grad():
        reference = local(x)
        return dict(url=url, timm_identical=bool(torch.equal(from_timm(x), reference)),
                    transformers_identical=bool(torch.equal(from_hf(x).logits, reference)))


def free_token_inputs(model: Any, generator: Any) -> tuple[Any, Any]:
    """Two padded samples a point or event model takes: points in the unit ball, or events on its sensor."""
    import torch

    valid = torch.ones(2, 300, dtype=torch.bool)
    valid[1, 200:] = False
    if hasattr(model.patch_embed, "sensor_size"):
        height, width = model.patch_embed.sensor_size
        xy = torch.stack([torch.randint(0, width, (2, 300), generator=generator),
                          torch.randint(0, height, (2, 300), generator=generator)], dim=-1).float()
        t = torch.rand(2, 300, 1, generator=generator) * model.patch_embed.time_scale * 8
        polarity = torch.randint(0, 2, (2, 300, 1), generator=generator).float() * 2 - 1
        return torch.cat([xy, t, polarity], dim=-1), valid
    return torch.randn(2, 300, model.patch_embed.in_chans, generator=generator) * 0.5, valid


def main(path: str) -> int:
    import pape_hub  # noqa: F401 - registers the models with timm and transformers

    items = json.loads(Path(path).read_text())
    results = {repo_id: roundtrip(Path(checkpoint), repo_id) for checkpoint, repo_id in items}
    print(json.dumps(results))
    return 0 if all(r["timm_identical"] and r["transformers_identical"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
