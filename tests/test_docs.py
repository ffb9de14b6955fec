"""Every Python block of the README and of ``docs/`` runs verbatim, as a reader would paste it: the blocks of one page
run in order in one fresh interpreter (a page reads as one session), in an empty folder, with the local Hub
endpoint's environment (the public Hub is unreachable here). The sources the blocks download are served there under
their real repo ids, written by timm's own ``push_to_hf_hub`` from full-size models of the source's architecture
(random weights: the path is what is tested, not ImageNet accuracy)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.commands.report import pages
from lab.local_hub import LocalHub

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` (CI) runs them

ROOT = Path(__file__).resolve().parent.parent
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.MULTILINE | re.DOTALL)

#: the sources the pages' blocks download, as timm names them (full size: the blocks build the published sizes)
STAND_INS = ["vit_small_patch16_rope_mixed_224.naver_in1k", "deit3_small_patch16_224.fb_in1k"]
PUSH = """
import timm
from timm.models import push_to_hf_hub
for name in {names!r}:
    push_to_hf_hub(timm.create_model(name), "timm/" + name, safe_serialization=True)
"""


def python_blocks(page: Path) -> list[str]:
    return _PYTHON_BLOCK.findall(page.read_text())


PAGES_WITH_CODE = [page for page in pages(ROOT) if python_blocks(page)]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A local Hub holding the stand-ins, and the environment a client needs to reach it."""
    data = tmp_path_factory.mktemp("docs-hub")
    server = LocalHub(data / "hub-data").start()
    env = {**server.client_env(), "HF_HOME": str(data / "hf_home"), "PYTHONPATH": str(ROOT)}
    pushed = run_python(PUSH.format(names=STAND_INS), data, env)
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    yield env
    server.stop()


def run_python(code: str, folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=folder, env=full,
                          timeout=600)


def test_every_page_with_python_has_been_found():
    names = {page.relative_to(ROOT).as_posix() for page in PAGES_WITH_CODE}
    assert {"README.md", "docs/pretrained.md", "docs/training.md"} <= names


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_python_blocks_of_a_page_run_verbatim(page, served, tmp_path):
    code = "\n".join(python_blocks(page))
    done = run_python(code, tmp_path, served)
    assert done.returncode == 0, f"{page.name}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    if page.name == "README.md":  # the quick start's printed lines are the ones the README shows
        assert "torch.Size([2, 10])\ntorch.Size([2, 10])\nPapeViTForImageClassification\n17 39\n" in done.stdout
        assert "timm/vit_small_patch16_rope_mixed_224.naver_in1k" in done.stdout


#: the public API whose docstring examples run, in this order, as one session (save, then load and push that folder)
API_EXAMPLES = ["pape_hub.save_checkpoint", "pape_hub.load_checkpoint", "pape_hub.push_checkpoint",
                "pape_hub.transplant", "pape_hub.evaluation.evaluate_checkpoint", "pape_hub.training.TrainConfig",
                "pape_hub.hf.PapeViTConfig"]
RUN_EXAMPLES = """
import doctest, importlib, sys
failed = 0
for path in {paths!r}:
    module, name = path.rsplit(".", 1)
    obj = getattr(importlib.import_module(module), name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder(recurse=False).find(obj, path, globs={{}}):
        assert test.examples, path + " has no example"
        failed += runner.run(test).failed
print("EXAMPLES FAILED", failed)
"""


def test_the_public_api_examples_run(served, tmp_path):
    """``Args:`` and a runnable ``Example:`` on the functions and configs a user starts from; the push goes to the
    local Hub, and every example's output is the one its docstring shows."""
    done = run_python(RUN_EXAMPLES.format(paths=API_EXAMPLES), tmp_path, served)
    assert "EXAMPLES FAILED 0" in done.stdout, done.stdout[-4000:] + done.stderr[-3000:]
