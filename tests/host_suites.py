"""The host libraries' own model tests, fetched from their source distributions for the installed versions (the
files are not copied into this repository): ``pip download --no-binary :all: --no-deps NAME==VERSION``, then the
members a harness needs are extracted into ``.host-suites/NAME-VERSION/`` (ignored by git, reused between runs)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".host-suites"


def fetch_suite(package: str, members: list[str]) -> Path:
    """The folder holding ``members`` (paths inside the sdist, e.g. ``tests/test_models.py``) of the installed
    ``package``'s sdist. Raises RuntimeError if the sdist cannot be downloaded."""
    version = importlib.metadata.version(package)
    folder = CACHE / f"{package}-{version}"
    if all((folder / m).exists() for m in members):
        return folder
    download = CACHE / "sdists"
    download.mkdir(parents=True, exist_ok=True)
    archive = next(download.glob(f"{package}-{version}.tar.gz"), None)
    if archive is None:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                               "-q", "-d", str(download), f"{package}=={version}"],
                              capture_output=True, text=True, timeout=600)
        archive = next(download.glob(f"{package}-{version}.tar.gz"), None)
        if archive is None:
            raise RuntimeError(f"could not download the {package} {version} sdist: {done.stderr[-500:]}")
    with tarfile.open(archive) as tar:
        for member in members:
            source = tar.extractfile(f"{package}-{version}/{member}")
            if source is None:
                raise RuntimeError(f"{archive.name} has no {member}")
            target = folder / member
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read())
    return folder


#: what transformers' test files import from files its sdist does not ship (``tests/exporters``,
#: ``tests/generation``, ``tests/utils``): mixins left empty (their tests do not apply: export is tested here, a
#: classifier does not generate) and ``config_common_kwargs``, the values ``ConfigTester`` sets on every config
TRANSFORMERS_STUBS = {
    "exporters/__init__.py": "",
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    "generation/__init__.py": "",
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
    "utils/__init__.py": "",
    "utils/test_configuration_utils.py": (
        "config_common_kwargs = {\n    'return_dict': False, 'output_hidden_states': True, 'output_attentions': True,\n"
        "    'dtype': 'float16', 'chunk_size_feed_forward': 5, 'architectures': ['BertModel'],\n"
        "    'id2label': {0: 'label'}, 'label2id': {'label': '0'}, 'problem_type': 'regression',\n}\n"),
}


def transformers_suite_package(where: Path) -> Path:
    """A package ``where/hostsuite`` holding transformers' ``test_modeling_common.py``,
    ``test_configuration_common.py`` and ``test_backbone_common.py`` (from the installed version's sdist), the stubs
    above, and this repository's model testers as ``test_pape_models.py``. Raises RuntimeError if the sdist cannot
    be downloaded."""
    members = ["tests/test_modeling_common.py", "tests/test_configuration_common.py",
               "tests/test_backbone_common.py"]
    suite = fetch_suite("transformers", members)
    package = where / "hostsuite"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    for member in members:
        (package / Path(member).name).write_text((suite / member).read_text())
    for name, text in TRANSFORMERS_STUBS.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    (package / "test_pape_models.py").write_text((ROOT / "tests" / "host_transformers_models.py").read_text())
    return package


#: test -> (encodings it fails for by design, None: every one; reason), each listed in the README
EXPECTED_TRANSFORMERS_FAILURES = {
    "test_model_weights_reload_no_missing_tied_weights": (None, "a weights file that lacks weights of the backbone "
                                                          "or encoding is refused (transformers would fill them "
                                                          "with a fresh init and print a table)"),
    "test_init_weights_can_init_buffers": ({"pape_ri"}, "PaPE-RI's per-head scale is a random buffer, as in the "
                                           "reference code (fixed, not learned), so two inits draw different ones"),
}


def expected_transformers_failure(test_id: str) -> bool:
    """Whether ``Class::test`` of ``host_transformers_models.py`` is listed above for its encoding."""
    cls, test = test_id.split("::")
    encodings, _ = EXPECTED_TRANSFORMERS_FAILURES.get(test, (set(), ""))
    return encodings is None or cls.split("_", 1)[1].removesuffix("_ModelTest").removesuffix("_BackboneTest") \
        in encodings


def transformers_test_classes() -> list[str]:
    """The test classes ``host_transformers_models.py`` defines: every encoding's image model, and its video model
    where the encoding is defined in 3-D."""
    import pape_hub
    from pape_hub.encodings import encoding_class

    return [f"PapeVi{'Vi' if video else ''}T_{e}_ModelTest" for e in pape_hub.list_encodings()
            for video in (False, True) if not video or 3 in encoding_class(e)[0].supported_ndims] + \
        [f"PapeViT_{e}_BackboneTest" for e in pape_hub.list_encodings()]


def run_transformers_suite(where: Path, selection: list[str]) -> tuple[int, list[str], str]:
    """(passed, failed ``Class::test`` ids, output) of transformers' ModelTesterMixin / ConfigTester run in
    ``where``; ``selection``: classes, or ``Class::test`` ids, of ``host_transformers_models.py``."""
    transformers_suite_package(where)
    done = subprocess.run([sys.executable, "-m", "pytest", *(f"hostsuite/test_pape_models.py::{s}" for s in selection),
                           "-q", "-rf", "-p", "no:cacheprovider", "-W", "ignore"], capture_output=True, text=True,
                          cwd=where, timeout=3600)
    failed = re.findall(r"^(?:SUB)?FAILED.*?hostsuite/test_pape_models.py::(\w+)::(\w+)", done.stdout,
                        flags=re.MULTILINE)
    passed = int((re.search(r"(\d+) passed", done.stdout) or [0, 0])[1])
    return passed, sorted({f"{cls}::{test}" for cls, test in failed}), done.stdout


#: (test, reason) of timm's tests that fail by design, each listed in the README
EXPECTED_TIMM_FAILURES = {
    "test_model_forward_torchscript": "TorchScript: positions are a dataclass and each encoding keeps Python state",
    "test_model_forward_fx_torchscript": "TorchScript of the FX graph: the same",
}
TIMM_CONFTEST = """def pytest_configure(config):
    import pape_hub  # noqa: F401 - registers the models before test_models.py lists them
"""


def run_timm_suite(where: Path, keyword: str = "vit_t4_") -> tuple[int, list[tuple[str, str]], str]:
    """(passed, failed (test, model name) pairs, output) of timm's ``tests/test_models.py`` on the registered names
    matching ``keyword``, run in ``where``."""
    suite = fetch_suite("timm", ["tests/test_models.py"])
    (where / "test_models.py").write_text((suite / "tests" / "test_models.py").read_text())
    (where / "conftest.py").write_text(TIMM_CONFTEST)
    done = subprocess.run([sys.executable, "-m", "pytest", "test_models.py", "-k", keyword, "-q", "-rf",
                           "-p", "no:cacheprovider", "-W", "ignore"], capture_output=True, text=True, cwd=where,
                          timeout=3600)
    failed = re.findall(r"^FAILED test_models.py::(\w+)\[[^\]]*?(vit_t4_\w+)\]", done.stdout, flags=re.MULTILINE)
    passed = int((re.search(r"(\d+) passed", done.stdout) or [0, 0])[1])
    return passed, failed, done.stdout


def one_name_per_encoding_class() -> list[str]:
    """The first registered name of each encoding class (``liere`` is ``liere8``'s class with another block size,
    ``rope_ape`` is ``rope``'s with a table, ...): what the test suite runs the host suites on; the script runs
    every name."""
    import pape_hub
    from pape_hub.encodings import encoding_class

    seen: set[type] = set()
    names = []
    for name in pape_hub.list_encodings():
        cls = encoding_class(name)[0]
        if cls not in seen:
            seen.add(cls)
            names.append(name)
    return names
