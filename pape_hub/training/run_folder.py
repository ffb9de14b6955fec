"""A run's output folder: one run per folder, a lock while it writes, a manifest of what it wrote (``overwrite``
removes only that), and the checks that let ``resume`` continue exactly."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from accelerate.utils.constants import RNG_STATE_NAME
from filelock import FileLock, Timeout

from ..checkpoint import atomic_write, recover_dir
from .settings import RESUME_HPARAMS, TrainConfig, comparable

__all__ = ["LOCK_NAME", "MANIFEST_NAME", "RUN_OUTPUTS", "check_output_dir", "check_resume", "check_state_files",
           "claim_output_dir", "release_output_dir", "resume_state_dir"]

LOCK_NAME, MANIFEST_NAME = ".pape_hub.lock", ".pape_hub_run.json"


#: what a training run writes in its output folder (and nothing else there is ever removed)
RUN_OUTPUTS = ("best", "last", "state", "metrics.jsonl", "results.json", "training_curve.png")


def _manifest(out: Path) -> list[str]:
    """What earlier runs of this package wrote in ``out`` (their manifest), or nothing."""
    path = out / MANIFEST_NAME
    try:
        listed = json.loads(path.read_text()).get("outputs", []) if path.is_file() else []
    except (ValueError, AttributeError):
        return []
    return [name for name in listed if name in RUN_OUTPUTS]


def _with_swap_names(out: Path, name: str) -> list[Path]:
    """``name`` and the temporary siblings this package makes while replacing it (``.name.tmp/.new/.old/.lock``,
    ``.name.tmp-<random>`` of an atomic file write), and nothing else: a user's ``.name.orig`` is not ours."""
    ours = {f".{name}.{suffix}" for suffix in ("tmp", "new", "old", "lock")}
    return [out / name, *(p for p in out.glob(f".{name}.*")
                          if p.name in ours or re.fullmatch(rf"\.{re.escape(name)}\.tmp-[a-z0-9_]{{8}}", p.name))]


def _resuming_here(cfg: TrainConfig) -> bool:
    out = Path(cfg.output_dir).resolve()
    return cfg.resume is not None and Path(cfg.resume).resolve() in (out, out / "state")


def check_output_dir(cfg: TrainConfig) -> None:
    """Refuse an output folder this run may not use, before any work and without touching it: a used folder
    without ``resume`` or ``overwrite``, and, with ``overwrite``, files in the way that no earlier run wrote."""
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--output-dir {out} exists and is not a folder")
    kind, _, root = cfg.dataset.partition(":")
    if kind in ("imagefolder", "videofolder") and root and out.resolve().is_relative_to(Path(root).resolve()):
        raise ValueError(f"--output-dir {out} lies inside the dataset {root}: its checkpoints and plots would be read "
                         "as a class (or images) on the next run; write the run outside the dataset folder")
    if not out.exists() or _resuming_here(cfg):
        return
    leftovers = sorted(p.name for p in out.iterdir() if p.name not in (LOCK_NAME, MANIFEST_NAME))
    if leftovers and not cfg.overwrite:
        raise FileExistsError(f"--output-dir {out} already holds a run ({', '.join(leftovers[:5])}); pass --resume "
                              f"{out} to continue it, --overwrite to replace it, or choose another folder")
    ours = set(_manifest(out))
    foreign = sorted(p.name for name in RUN_OUTPUTS if name not in ours for p in _with_swap_names(out, name)
                     if p.exists())
    if foreign:
        raise FileExistsError(f"--output-dir {out} holds {', '.join(foreign[:5])}, which no pape_hub run wrote there "
                              "(its manifest does not list them); --overwrite removes only a run's own outputs, so "
                              "move them or choose another folder")


def claim_output_dir(cfg: TrainConfig, main: bool) -> FileLock | None:
    """Lock the folder for this run, remove what an earlier run listed in its manifest (with ``overwrite``), and
    list this run's outputs before writing any. Called once everything has been checked."""
    if not main:  # only the main process writes; another one re-checking would race with its manifest write
        return None
    check_output_dir(cfg)  # again: the folder may have changed while the data and model were prepared
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout as err:
        raise RuntimeError(f"another run is writing to {out} (its lock {out / LOCK_NAME} is held); wait for it to "
                           "finish or choose another --output-dir") from err
    if cfg.overwrite and not _resuming_here(cfg):
        for name in _manifest(out):
            for path in _with_swap_names(out, name):
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    atomic_write(out / MANIFEST_NAME, lambda p: p.write_text(json.dumps(dict(
        written_by="pape_hub training", outputs=list(RUN_OUTPUTS)), indent=1) + "\n"))
    return lock


def release_output_dir(lock: FileLock | None, cfg: TrainConfig) -> None:
    if lock is not None:
        lock.release()
        (Path(cfg.output_dir) / LOCK_NAME).unlink(missing_ok=True)  # no empty lock file left behind


def resume_state_dir(resume: str | Path) -> Path:
    """The state folder of ``--resume`` (a run folder or its ``state/``), after finishing an interrupted swap."""
    resume_dir = Path(resume)
    candidate = resume_dir / "state"
    if candidate.is_dir() or any(resume_dir.glob(".state.*")):
        return recover_dir(candidate)
    return recover_dir(resume_dir)


def check_resume(cfg: TrainConfig, state_dir: Path, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The saved trainer state, after checking the run can continue exactly as ``cfg`` describes, on the same data
    (``data``: :func:`~pape_hub.data.data_fingerprint` of today's splits)."""
    path = state_dir / "trainer_state.json"
    if not path.exists():
        raise FileNotFoundError(f"cannot resume: {path} does not exist (was the run saved at least one epoch?)")
    saved = json.loads(path.read_text())
    if saved["identity"] != cfg.identity():
        raise ValueError(f"cannot resume: {state_dir} is a checkpoint of {saved['identity']}, "
                         f"but this run is {cfg.identity()}")
    if not any(state_dir.glob(f"{RNG_STATE_NAME}*.pkl")):
        raise FileNotFoundError(f"cannot resume exactly: {state_dir} has no random-number state "
                                f"({RNG_STATE_NAME}_*.pkl); the data order and augmentation would differ")
    check_state_files(state_dir)
    check_same_data(saved.get("data"), data, state_dir)
    now = asdict(cfg)
    changed = {k: (_saved_setting(saved["config"], k), now[k]) for k in RESUME_HPARAMS
               if comparable(_saved_setting(saved["config"], k)) != comparable(now[k])}
    if changed and not cfg.allow_changed_hparams:
        listing = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in changed.items())
        raise ValueError(f"cannot resume {state_dir} with other hyper-parameters ({listing}); pass the saved values, "
                         "or --allow-changed-hparams to continue with the new ones")
    return saved


def check_same_data(saved: dict[str, Any] | None, now: dict[str, Any] | None, state_dir: Path) -> None:
    """Refuse to resume on other data: files added to or removed from a folder re-cut the validation split, so that
    images trained on would be validated on (and the reverse). A state saved before splits were recorded has none."""
    if saved is None or now is None:
        return
    changed = [f"{name}: {saved[name]['count']} samples then, {now[name]['count']} now" +
               ("" if saved[name]["count"] != now[name]["count"] else " (other files)")
               for name in ("train", "val", "test") if name in saved and saved[name] != now.get(name)]
    if changed:
        raise ValueError(f"cannot resume {state_dir}: the data changed since it was saved ({'; '.join(changed)}), so "
                         "its splits would no longer be the run's (trained-on images could land in validation). "
                         "Restore the dataset as it was, or start a new run (--output-dir elsewhere)")


def check_state_files(state_dir: Path) -> None:
    """Read every file of a saved training state as accelerate will (``weights_only``: no code runs from them), so
    that a truncated or corrupt one is named now: accelerate itself skips random-number states it cannot read and
    would resume silently with another data order."""
    from accelerate.utils import load as accelerate_load
    from safetensors import SafetensorError, safe_open

    for path in sorted(state_dir.iterdir()):
        try:
            if path.suffix == ".safetensors":
                with safe_open(str(path), "pt") as fh:
                    [fh.get_slice(k) for k in fh.keys()]
            elif path.suffix in (".pkl", ".bin", ".pt"):
                accelerate_load(path, map_location="cpu")
        except (OSError, RuntimeError, ValueError, EOFError, SafetensorError, pickle.UnpicklingError) as err:
            raise ValueError(f"cannot resume: {path} is truncated or corrupt ({type(err).__name__}: "
                             f"{str(err)[:200]}); resume from an intact copy, or start again") from err


def _saved_setting(config: dict[str, Any], name: str) -> Any:
    """A saved run's setting, in today's terms: runs saved before recipes existed trained with the default one, and
    wrote "no clipping" as None (today 0)."""
    value = config.get(name, "default" if name == "recipe" else None)
    return 0.0 if name == "clip_grad" and value is None else value
