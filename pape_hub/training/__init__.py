"""One training loop on accelerate for every model and dataset (``pape-hub train``, or ``train`` from Python).

A recipe (:mod:`pape_hub.recipes`: ``default``, or a paper's own, e.g. ``paper-pape``) decides the init of the
linear layers, which parameters weight decay reaches, the schedule's shape and the values of the settings it states;
any setting given explicitly wins. The ``default`` recipe: AdamW, linear warm-up then cosine, no weight decay on
norms, biases and position parameters, label smoothing, drop path. Data augmentation comes from ``timm.data`` as a
preset (``aug``, e.g. ``default`` = DeiT's RandAugment / Mixup / CutMix) whose parts can each be overridden.
Pixels are normalised with the training split's own mean and std unless ``normalize="model"``.
Runs as ``python``, ``pape-hub`` or ``accelerate launch`` (CPU, one GPU or many).

The package, one idea per module:
    settings.py     :class:`TrainConfig`, every setting and its checks
    run_folder.py   the output folder: its manifest, lock, overwrite and resume rules
    data.py         the data of a run: splits, transforms, normalisation, loaders
    loop.py         the model, the optimizer, the epochs and the checkpoints (:func:`train`)

Output folder (one run per folder: a non-empty folder is refused unless ``overwrite`` or ``resume``, and a lock
keeps a second run out while one is writing):
    best/, last/         model.safetensors + config.json (both faces' layout), written atomically each epoch
    state/               accelerate ``save_state`` (model, optimizer, scheduler, RNG, sampler) + trainer_state.json
    metrics.jsonl        one JSON line per epoch
    results.json         final numbers (test split scored with the best-on-validation checkpoint)
    .pape_hub_run.json   the manifest: what this package writes here. ``overwrite`` removes only what an earlier
                         run's manifest lists, after every setting, the data and the model have been checked;
                         it never removes a file it did not write.
Every folder is swapped in whole (:func:`~pape_hub.checkpoint.replace_dir`), so a kill at any point leaves a
complete copy that ``resume`` and loading find. A non-finite loss stops the run with an error before the
optimizer step; the checkpoints of the last finished epoch stay as they were.
"""

from ..recipes import AUGMENTATION_PRESETS
from .loop import build_model, seed_from, train
from .run_folder import LOCK_NAME, MANIFEST_NAME, RUN_OUTPUTS
from .settings import TrainConfig

__all__ = ["AUGMENTATION_PRESETS", "LOCK_NAME", "MANIFEST_NAME", "RUN_OUTPUTS", "TrainConfig", "build_model",
           "seed_from", "train"]
