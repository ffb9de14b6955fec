"""Which part of the PaPE paper's recipe costs the arrow task its seeds: one encoding (PaPE unless told) on the
main job's setting, trained under ``paper-pape`` and under ``paper-pape`` with one part at a time put back to the
``default`` recipe's (the init of the linear layers and the head, the weight-decay groups, the schedule's shape,
gradient clipping). Everything else is the main job's (``python -m lab arrows --recipe paper-pape``). Runs one after
another in this process (each with one thread); writes ``results/recipe_bisection/`` (block ``recipe_bisection``).

    python -m lab.recipe_bisection --seeds 4                    # PaPE on seed 4 (about 10 minutes)
    python -m lab.recipe_bisection --encoding liere8 --seeds 1  # another seed default solves and paper-pape does not
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path

from lab import REPOSITORY
from lab.commands.arrows import PRESET, SETTINGS, arrow_training
from lab.experiment import aggregate, make_job, summary_table, train_and_evaluate, write_results
from lab.provenance import provenance
from pape_hub.recipes import RECIPES
from pape_hub.records import Comparison

BASE = RECIPES["paper-pape"]
#: label -> (recipe, TrainConfig overrides): paper-pape, then one part each put back to the default recipe's
VARIANTS = {
    "paper-pape": (BASE, {}),
    "paper-pape, timm init": (dataclasses.replace(BASE, name="paper-pape/timm-init", init="timm",
                                                  uniform_head=False), {}),
    "paper-pape, no decay on position params, norms, biases": (
        dataclasses.replace(BASE, name="paper-pape/decay-groups", decay_all=False), {}),
    "paper-pape, warm-up + cosine": (dataclasses.replace(BASE, name="paper-pape/warmup-cosine",
                                                         schedule="warmup_cosine"), {}),
    "paper-pape, clipping 1.0": (BASE, {"clip_grad": 1.0}),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoding", default="pape", help="the encoding trained (default: pape)")
    parser.add_argument("--seeds", default="4", help="comma-separated training seeds (default: a seed `paper-pape` "
                        "leaves unsolved for PaPE on both machines measured; docs/experiments/recipes.md)")
    parser.add_argument("--output-dir", default="outputs/recipe_bisection", help="checkpoints and logs")
    parser.add_argument("--results-dir", default=str(REPOSITORY / "results" / "recipe_bisection"))
    args = parser.parse_args()
    started = time.time()
    setting, seeds, grids = SETTINGS["default"], [int(s) for s in args.seeds.split(",")], [4, 6, 8]
    results = []
    for label, (recipe, overrides) in VARIANTS.items():
        RECIPES[recipe.name] = recipe  # this process only: the runs below train in it
        train = arrow_training(setting, dict(PRESET, recipe=recipe.name, **overrides))
        for seed in seeds:
            job = make_job(label, {}, seed, Path(args.output_dir), dict(train, model=f"vit_m12_{args.encoding}"),
                           sweep=dict(dataset="arrows", sizes=grids, eval_size=PRESET["eval_size"]))
            result = train_and_evaluate(job)
            results.append(result)
            top = result.accuracy(4)
            print(f"  {label} seed {seed}: test grid 4 {top:.3f} ({time.time() - started:.0f}s)", flush=True)
    command = "python -m lab.recipe_bisection " + shlex.join(sys.argv[1:])
    facts = dict(provenance=provenance("arrows", command=command.strip()), task=dict(setting="default", **setting),
                 recipe=dict(recipe="paper-pape", variants=list(VARIANTS)), epochs=PRESET["epochs"],
                 encoding=args.encoding)
    summary = Comparison(facts, grids, "grid", seeds, list(VARIANTS), results, aggregate(results, grids),
                         wall_s=round(time.time() - started))
    print("\n" + summary_table(summary))
    write_results(summary, Path(args.results_dir),
                  title=f"{args.encoding} under paper-pape, one part put back, seeds {seeds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
