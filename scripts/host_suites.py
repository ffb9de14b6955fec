"""Run the host libraries' own model tests on everything: timm's ``tests/test_models.py`` on every ``vit_t4_*``
name and transformers' whole ``ModelTesterMixin`` / ``ConfigTester`` on every encoding's image and video model
(about 30 minutes on 2 cores; the test suite runs the timm part and a slice of the transformers part,
``tests/test_host_suites.py``). Prints the pass / fail counts and every failure that is not listed as by design.

    python scripts/host_suites.py                 # both suites, every encoding
    python scripts/host_suites.py --only transformers --encodings pape,rope
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from host_suites import (  # noqa: E402 - the harness lives beside the tests it serves
    EXPECTED_TIMM_FAILURES,
    expected_transformers_failure,
    run_timm_suite,
    run_transformers_suite,
    transformers_test_classes,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["timm", "transformers"], default=None, help="one suite (default: both)")
    parser.add_argument("--encodings", default=None, help="comma-separated (default: every encoding)")
    args = parser.parse_args()
    unexpected: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pape_hub_host_suites_") as tmp:
        if args.only in (None, "timm"):
            keyword = " or ".join(f"vit_t4_{e}" for e in args.encodings.split(",")) if args.encodings else "vit_t4_"
            passed, failed, _ = run_timm_suite(Path(tmp), keyword)
            print(f"timm tests/test_models.py: {passed} passed, {len(failed)} failed", flush=True)
            unexpected += [f"timm {t}[{n}]" for t, n in failed if t not in EXPECTED_TIMM_FAILURES]
        if args.only in (None, "transformers"):
            if args.encodings:
                os.environ["PAPE_ENCODINGS"] = args.encodings
            wanted = args.encodings.split(",") if args.encodings else None
            classes = [c for c in transformers_test_classes()
                       if wanted is None or c.split("_", 1)[1].removesuffix("_ModelTest") in wanted]
            passed, failed, _ = run_transformers_suite(Path(tmp) / "transformers", classes)
            print(f"transformers ModelTesterMixin + ConfigTester on {len(classes)} classes: {passed} passed, "
                  f"{len(failed)} failed", flush=True)
            unexpected += [f"transformers {f}" for f in failed if not expected_transformers_failure(f)]
    for line in unexpected:
        print("UNEXPECTED:", line)
    print("every failure is one listed as by design" if not unexpected else f"{len(unexpected)} unexpected failure(s)")
    return 1 if unexpected else 0


if __name__ == "__main__":
    raise SystemExit(main())
