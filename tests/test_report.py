"""Every number the README, the docs pages and the model cards show comes from a results file: hand-edited tables
and card claims without a measurement fail here. Whether the results are current (measured by code that behaves as
today's) is the release gate ``python -m lab report --check``, not a unit test: a refactor must not need hours of
re-runs. The behaviour probes themselves are tested here: deterministic, and they flag a numerical change."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lab.commands.report import BLOCKS, WIDTH, check, pages, render

ROOT = Path(__file__).resolve().parent.parent


def test_the_pages_show_the_results():
    problems = check(pages(ROOT), ROOT / "results", behaviour=False)
    assert not problems, "\n".join(problems)


def test_every_result_records_its_behaviour_and_a_numerical_change_is_flagged(monkeypatch):
    from lab.provenance import RESULT_PROBES, behaviour, behaviour_differences, decode_behaviour

    for path in (ROOT / "results").rglob("*.json"):
        prov = json.loads(path.read_text())["provenance"]
        assert prov["kind"] in RESULT_PROBES and prov["behaviour"], path
    recorded = decode_behaviour(json.loads((ROOT / "results" / "bench_vit_b16_224_cpu.json").read_text())
                                ["provenance"]["behaviour"])
    now = behaviour("bench")
    assert not behaviour_differences(recorded, now)  # the model probe: the encodings compute what they did
    changed = {k: [v * (1 + 1e-3) for v in values] for k, values in now.items()}
    assert len(behaviour_differences(recorded, changed)) == len(set(recorded) & set(now))  # newer probes: no record


def test_the_probes_follow_the_forward_not_the_order_of_the_init_draws(monkeypatch):
    """An init that draws its numbers in another order (PaPE's projections initialised in reverse, an extra draw
    before every module) builds other models from the same seed, but the probes fill every weight by name, so they
    and every result's currency stay as they were; a change of what the forward computes still moves them."""
    import torch

    from lab import provenance
    from pape_hub.encodings.pape import PaPE, ParabolicEncoding
    from pape_hub.models import vit

    before = provenance._probe_models()
    torch.manual_seed(0)
    drawn_before = timm_pape()
    init_module, token_positions = vit.init_module, ParabolicEncoding.token_positions

    def one_more_draw(module):
        torch.rand(3)
        init_module(module)

    def reversed_reset(self):
        for name in ("tilt_proj", "curvature_proj", "position_proj"):
            bound = 1 / getattr(self.ctx, "ndim" if name == "position_proj" else "dim") ** 0.5
            torch.nn.init.uniform_(getattr(self, name), -bound, bound)

    monkeypatch.setattr(vit, "init_module", one_more_draw)
    monkeypatch.setattr(PaPE, "reset_parameters", reversed_reset)
    torch.manual_seed(0)
    assert not torch.equal(timm_pape(), drawn_before)  # the same seed draws another model now
    assert not provenance.behaviour_differences(before, provenance._probe_models())
    monkeypatch.setattr(ParabolicEncoding, "token_positions", lambda self, pos: 1.01 * token_positions(self, pos))
    assert [p.split(":")[0] for p in provenance.behaviour_differences(before, provenance._probe_models())] == \
        ["vit/pape", "vit/pape_ri", "vivit/pape", "vivit/pape_ri"]  # a change of the forward moves its probes


def timm_pape():
    import timm
    import torch

    model = timm.create_model("vit_t4_pape", embed_dim=32, depth=1, num_heads=2)
    return torch.cat([p.flatten() for p in model.parameters()])


def test_every_block_is_generated_and_every_generator_has_a_page():
    """Each generated block of the README and docs/ names a generator, every generator is shown somewhere, the
    README stays an index (at most 200 lines) and generated prose is wrapped at 120 columns."""
    names = []
    for path in pages(ROOT):
        page = path.read_text()
        names += re.findall(r"<!-- generated: (\w+) -->", page)
        assert render(page, ROOT / "results", path.name) == page
        for block in re.findall(r"<!-- generated: \w+ -->\n(.*?)<!-- end generated", page, flags=re.DOTALL):
            assert all(len(line) <= WIDTH for line in block.splitlines() if not line.startswith("|")), path
    assert set(names) <= set(BLOCKS) and set(BLOCKS) <= set(names)
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def measured_numbers(summary: dict) -> set[str]:
    """Every accuracy a main-job summary holds, as a card prints them (3 decimals in tables, 4 in the metadata)."""
    values = []
    for run in summary["runs"]:
        values += [row["top1"] for row in run["rows"]] + [run["train"]["best_val_top1"]]
    for columns in summary["aggregate"].values():
        for stats in columns.values():
            values += [stats["mean"], stats["std"], stats["min"], stats["max"]]
    return {f"{v:.3f}" for v in values} | {f"{round(v, 4)}" for v in values}


def section(body: str, title: str) -> str:
    match = re.search(rf"^## {title}\n(.*?)(?=^## |\Z)", body, flags=re.MULTILINE | re.DOTALL)
    return match.group(1) if match else ""


@pytest.mark.parametrize("card", sorted((ROOT / "model_cards").glob("*.md")), ids=lambda p: p.stem)
def test_model_cards_claim_only_what_the_results_hold(card):
    summary = json.loads((ROOT / "results" / "arrows_main_job" / "summary.json").read_text())
    text = card.read_text()
    metadata, body = text.split("\n---\n", 1)
    claims = re.findall(r"value: ([0-9.]+)", metadata)
    claims += re.findall(r"(?<![\d.])[01]\.\d{3}(?!\d)", section(body, "Evaluation"))
    assert claims, "a card without measured numbers"
    from pape_hub.records import chance_interval

    guessing = {f"{bound:.3f}" for run in summary["runs"] for row in run["rows"]  # the "at chance" sentence's interval
                for bound in chance_interval(run["num_classes"], row["count"])}
    unmeasured = sorted(set(claims) - measured_numbers(summary) - guessing)
    assert not unmeasured, f"{card.name} claims {unmeasured}, which results/arrows_main_job/summary.json lacks"
    speed = section(body, "Speed")
    if speed:
        bench = json.loads((ROOT / "results" / "bench_vit_b16_224_cpu.json").read_text())
        rows = [r for run in bench["runs"] for r in run["rows"].values()]
        base = {id(r): run["rows"]["timm_ape"]["infer_ms"] for run in bench["runs"] for r in run["rows"].values()}
        allowed = {f"{r['infer_ms']:.1f}" for r in rows} | {f"{r['infer_ms'] / base[id(r)]:.3f}" for r in rows}
        numbers = set(re.findall(r"\|\s*([0-9]+\.[0-9]+)\s*(?=\|)", speed))
        assert numbers and numbers <= allowed, f"{card.name} speed claims {sorted(numbers - allowed)}"
    assert "REPO_ID" not in text and "import pape_hub" in text and (card.with_suffix(".png")).exists()


@pytest.mark.parametrize("flags,results,output", [
    ([], "arrows_main_job", "outputs/arrows"),
    (["--full"], "arrows_full", "outputs/arrows_full"),
    (["--isolated"], "arrows_isolated", "outputs/arrows_isolated"),
    (["--recipe", "paper-pape"], "arrows_main_job_paper_pape", "outputs/arrows_paper_pape"),
    (["--epochs", "10", "--results-dir", "results/arrows_rope_mixed_long"], "arrows_rope_mixed_long",
     "outputs/arrows_rope_mixed_long"),
    (["--results-dir", "none"], None, "outputs/arrows_no_results"),
    (["--results-dir", "none", "--output-dir", "mine"], None, "mine"),
])
def test_only_the_main_job_writes_the_checkpoints_its_cards_describe(flags, results, output):
    """`outputs/arrows` holds the main job's checkpoints (what `--cards-only` and the pushed repos describe); every
    other run of the command keeps its checkpoints beside them unless told where."""
    import argparse

    from lab.commands.arrows import add_arguments, run_setting

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    *_, results_dir, output_dir = run_setting(parser.parse_args(flags))
    assert (results_dir.name if results_dir else None, str(output_dir)) == (results, output)


def test_cards_only_writes_the_main_jobs_cards_from_its_results(tmp_path, monkeypatch):
    """`python -m lab arrows --cards-only` (after a bench run) writes model_cards/ again from the main job's results
    and first-seed checkpoints, training nothing: the measured parts of each card, its model-index and its speed,
    are the committed card's. A missing checkpoint is named."""
    import argparse
    import shutil

    import timm
    from huggingface_hub import ModelCard

    from lab.commands import arrows
    from pape_hub.checkpoint import save_checkpoint

    shutil.copytree(ROOT / "results" / "arrows_main_job", tmp_path / "results" / "arrows_main_job")
    shutil.copy(ROOT / "results" / "bench_vit_b16_224_cpu.json", tmp_path / "results")
    summary = json.loads((tmp_path / "results" / "arrows_main_job" / "summary.json").read_text())
    first = [run for run in summary["runs"] if run["seed"] == summary["seeds"][0]]
    for run in first:  # untrained stand-ins of the main job's checkpoints: the cards' numbers come from results/
        model = timm.create_model(run["architecture"], num_classes=4, patch_size=12, img_size=48)
        save_checkpoint(model, tmp_path / run["checkpoint"])
    monkeypatch.setattr(arrows, "REPOSITORY", tmp_path)
    parser = argparse.ArgumentParser()
    arrows.add_arguments(parser)
    assert arrows.run(parser.parse_args(["--cards-only"])) == 0
    written = sorted(path.name for path in (tmp_path / "model_cards").glob("*.md"))
    assert written == sorted(path.name for path in (ROOT / "model_cards").glob("*.md"))
    for name in written:
        new, committed = (folder / "model_cards" / name for folder in (tmp_path, ROOT))
        values = [[metric["value"] for result in ModelCard.load(card).data.to_dict()["model-index"][0]["results"]
                   for metric in result["metrics"]] for card in (new, committed)]
        assert values[0] == values[1], name
        assert section(new.read_text(), "Speed") == section(committed.read_text(), "Speed"), name
    shutil.rmtree(tmp_path / first[0]["checkpoint"])
    with pytest.raises(FileNotFoundError, match=re.escape(first[0]["checkpoint"])):
        arrows.run(parser.parse_args(["--cards-only"]))
    with pytest.raises(ValueError, match="main job's cards .* drop --results-dir, --full"):
        arrows.run(parser.parse_args(["--cards-only", "--full"]))


def test_a_new_probe_keeps_earlier_results_current():
    """An encoding added later brings its own probe: results measured before it existed stay current; a probe
    that disappears (an encoding removed) or changes does not."""
    from lab.provenance import behaviour_differences

    recorded = {"vit/ape": [1.0, 2.0]}
    assert behaviour_differences(recorded, {"vit/ape": [1.0, 2.0], "vit/new": [3.0]}) == []
    assert behaviour_differences({**recorded, "vit/gone": [1.0]}, recorded) == ["vit/gone: no longer probed"]
    assert len(behaviour_differences(recorded, {"vit/ape": [1.0, 2.1], "vit/new": [3.0]})) == 1


def test_startup_bench_writes_medians_ratios_and_goals(tmp_path, monkeypatch):
    """`python -m lab bench --startup` (fast stand-in commands here): medians, the ratio to `import timm`, the goals."""
    import argparse

    from lab.commands import bench
    from lab.commands.report import startup_block

    monkeypatch.setattr(bench, "STARTUP", {"import timm": ["-c", "pass"], "import pape_hub": ["-c", "pass"],
                                           "pape-hub --help": ["-c", "pass"]})
    output = tmp_path / "bench_startup_cpu.json"
    assert bench.startup(argparse.Namespace(repeats=2, output=str(output))) == 0
    data = json.loads(output.read_text())
    assert set(data["rows"]) == {"import timm", "import pape_hub", "pape-hub --help"}
    assert all(len(row["runs_s"]) == 2 and row["median_s"] > 0 for row in data["rows"].values())
    assert data["rows"]["pape-hub --help"]["goal"] == "< 1 s" and data["rows"]["import timm"]["goal"] is None
    assert "| `import pape_hub` |" in startup_block(tmp_path, "bench_startup_cpu.json")


def test_bootstrap_interval_of_the_mean():
    from lab.experiment import bootstrap_interval

    values = [0.25, 0.25, 1.0, 1.0, 0.9]
    low, high = bootstrap_interval(values)
    assert min(values) < low < sum(values) / len(values) < high <= max(values)
    assert bootstrap_interval(values) == (low, high)  # a fixed generator: the same interval everywhere
    assert bootstrap_interval([0.5, 0.5, 0.5]) == (0.5, 0.5)
    three = bootstrap_interval([0.2, 0.6, 1.0])  # 3 seeds: the interval reaches the range
    assert three[0] == pytest.approx(0.2) and three[1] == pytest.approx(1.0)


def fake_memory_run(monkeypatch, tmp_path, cell: Callable[[list[str], dict[str, str]], dict[str, float]]):
    """`python -m lab memory`'s parser and run, each cell's process replaced by ``cell(command, env)`` (its JSON row);
    plotting left out. Returns (parser, run(argv) -> the written report)."""
    import argparse
    import json

    from lab.commands import memory

    real_run = memory.subprocess.run

    def fake_run(command, **kwargs):
        if "env" not in kwargs:  # git, for the provenance
            return real_run(command, **kwargs)
        return argparse.Namespace(returncode=0, stdout=json.dumps(cell(command, kwargs["env"])) + "\n", stderr="")

    monkeypatch.setattr(memory.subprocess, "run", fake_run)
    monkeypatch.setattr(memory, "plot", lambda report, path: None)
    monkeypatch.setattr(memory.sys, "argv", ["lab", "memory"])
    parser = argparse.ArgumentParser()
    memory.add_arguments(parser)
    output = tmp_path / "memory.json"

    def run(argv: list[str]) -> dict:
        assert memory.run(parser.parse_args([*argv, "--output", str(output)])) == 0
        return json.loads(output.read_text())

    return parser, run


def test_the_memory_probe_can_fix_glibcs_mmap_threshold_and_says_so(tmp_path, monkeypatch):
    """`python -m lab memory --mmap-threshold N` hands each CPU cell MALLOC_MMAP_THRESHOLD_=N and its table names it;
    a threshold for a GPU, or a negative one, is refused by name."""
    from lab.commands import memory
    from lab.commands.report import memory_block

    seen = []
    row = dict(peak_mb=1.0, tensors_mb=1.0, time_s=0.1, first_s=0.1)
    parser, run = fake_memory_run(monkeypatch, tmp_path,
                                  lambda command, env: seen.append(env.get("MALLOC_MMAP_THRESHOLD_")) or row)
    run(["--encodings", "ape,alibi", "--resolutions", "32", "--mmap-threshold", "65536"])
    assert seen == ["65536", "65536"]
    assert "mmap threshold fixed at 65536 bytes" in memory_block(tmp_path, "memory.json")
    for bad in (["--mmap-threshold", "-1"], ["--mmap-threshold", "0", "--device", "cuda"]):
        with pytest.raises(ValueError, match="--mmap-threshold"):
            memory.run(parser.parse_args(bad))


def test_the_goals_block_names_every_miss_and_why_or_that_it_is_not_explained(tmp_path):
    """The issue's goals on memory and time, one row per goal and device measured: the worst encoding, and each one
    over the line with its recorded reason, grouped by reason; a miss without one reads "not explained" (the control:
    an encoding with no reason recorded), a goal without results has no row."""
    from lab.commands.report import MISSED_BECAUSE, goals_block

    provenance = {"commit": "0123456789abcdef"}
    ratio = lambda memory, time: {"448": {"memory": memory, "time": time}}  # noqa: E731
    train = {"provenance": provenance, "ratios": {"ape": ratio(1.0, 1.0), "liere8": ratio(1.4, 1.7),
                                                  "liere": ratio(1.5, 7.0), "none": ratio(1.0, 1.6)}}
    bench = {"provenance": provenance, "runs": [{"rows": {"timm_ape": {"infer_ms": 10.0}, "rope": {"infer_ms": 11.0},
                                                          "timm_rope": {"infer_ms": 30.0}}}]}
    (tmp_path / "memory_train_vit_s16_448_cpu.json").write_text(json.dumps(train))
    (tmp_path / "bench_vit_b16_448_cpu.json").write_text(json.dumps(bench))
    rows = [line for line in goals_block(tmp_path).splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 3  # training memory and time, inference time, on the CPU
    memory_row, time_row, infer_row = rows
    assert "`liere` 1.50x" in memory_row and memory_row.endswith("none: met |")
    because = MISSED_BECAUSE[("train_time", "cpu", "liere")]
    assert f"`liere` 7.00x: {because}" in time_row and "`none` 1.60x: not explained" in time_row
    assert "`liere8` 1.70x: " + MISSED_BECAUSE[("train_time", "cpu", "liere8")] in time_row
    assert "`rope` 1.10x" in infer_row and infer_row.endswith("none: met |") and "timm_rope" not in infer_row


def test_the_training_time_goal_reads_the_in_process_bench_where_there_is_one(tmp_path):
    """The training-time goal takes ``lab bench --train-baseline ape``'s ratios (each step timed against `ape`'s in
    one process) over ``lab memory --train``'s (fresh processes), and names the file it read; a bench timed against
    another baseline is refused by name (the control: its ratios would read as met against the wrong model)."""
    from lab.commands.report import bench_block, goals_block

    provenance = {"commit": "0123456789abcdef"}
    ratio = lambda memory, time: {"448": {"memory": memory, "time": time}}  # noqa: E731
    train = {"provenance": provenance, "ratios": {"ape": ratio(1.0, 1.0), "sape2": ratio(1.2, 1.8)}}
    rows = {"timm_ape": {"infer_ms": 10.0, "train_ratio": 0.9, "train_round_ratios": [0.9, 0.95, 0.85]},
            "ape": {"infer_ms": 10.0, "train_ratio": 1.0},
            "sape2": {"infer_ms": 13.0, "train_ratio": 1.45, "train_round_ratios": [1.4, 1.45, 1.6]}}
    bench = {"provenance": provenance, "device": "CPU", "dtype": "torch.float32", "batch_size": 2, "repeats": 6,
             "runs": [{"size": "s", "resolution": 448, "rows": rows, "train_baseline": "ape", "train_batch_size": 4}]}
    (tmp_path / "memory_train_vit_s16_448_cpu.json").write_text(json.dumps(train))
    (tmp_path / "bench_vit_s16_448_train_cpu.json").write_text(json.dumps(bench))
    time_row = next(line for line in goals_block(tmp_path).splitlines() if line.startswith("| the same: time"))
    assert "`bench_vit_s16_448_train_cpu.json`" in time_row and "`sape2` 1.45x" in time_row
    assert time_row.endswith("none: met |") and "timm_ape" not in time_row
    table = bench_block(tmp_path, "bench_vit_s16_448_train_cpu.json")
    assert "train step × `ape`" in table and "| 1.450 (1.40-1.60) |" in table and "against its steps" in table
    bench["runs"][0]["train_baseline"] = "timm_ape"
    (tmp_path / "bench_vit_s16_448_train_cpu.json").write_text(json.dumps(bench))
    with pytest.raises(ValueError, match="--train-baseline ape"):
        goals_block(tmp_path)


def test_the_bench_times_training_against_the_baseline_named(monkeypatch):
    """``lab bench --train-baseline K``: every group of models is timed with K, each round's ratio is kept, and K's own
    ratio is 1; a baseline not among the models is refused before anything is timed."""
    import argparse

    from lab.commands import bench

    class Tiny(torch.nn.Sequential):
        def __init__(self) -> None:
            super().__init__(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 1000))

    models = {key: Tiny() for key in ("timm_ape", "ape", "alibi", "rope", "sape2")}
    rows: dict = {key: {} for key in models}
    args = argparse.Namespace(train_batch_size=2, train_baseline="ape", train_skip="", train_group=2, repeats=6)
    groups = []
    timed = bench.interleaved
    monkeypatch.setattr(bench, "interleaved", lambda fns, *a: groups.append(list(fns)) or timed(fns, *a))
    bench.measure_training(models, rows, args, 4, torch.device("cpu"), contextlib.nullcontext(), lambda: None)
    assert groups == [["ape", "timm_ape", "alibi"], ["ape", "rope", "sape2"]]
    # beside each time, the peak of the tensors one step allocates: the gradients of the one layer, 48 x 1000 + 1000
    assert all(rows[key]["train_tensors_mb"] >= 49_000 * 4 / 2**20 for key in models)
    assert rows["ape"]["train_ratio"] == 1.0 and "train_round_ratios" not in rows["ape"]
    assert all(len(rows[key]["train_round_ratios"]) == 3 for key in ("timm_ape", "alibi", "rope", "sape2"))
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with pytest.raises(ValueError, match="--train-baseline 'nope'"):
        bench.run(parser.parse_args(["--encodings", "ape", "--train-baseline", "nope"]))


def test_a_call_s_tensors_are_its_peak_of_live_bytes_over_those_before_it():
    """``call_tensors_mb`` on CPU: a call holding 4 MB and 2 MB at once, then freeing them, peaks at 6 MB; tensors live
    before the call do not count; the control, a call holding them one at a time, peaks at 4 MB."""
    from lab.commands.memory import call_tensors_mb

    held_before = torch.empty(4 << 20, dtype=torch.uint8)
    cpu = torch.device("cpu")

    def together() -> None:
        a = torch.empty(4 << 20, dtype=torch.uint8)
        b = torch.empty(2 << 20, dtype=torch.uint8)
        del a, b

    def one_at_a_time() -> None:
        a = torch.empty(4 << 20, dtype=torch.uint8)
        del a
        b = torch.empty(2 << 20, dtype=torch.uint8)
        del b

    assert call_tensors_mb(together, cpu) == pytest.approx(6.0)
    assert call_tensors_mb(one_at_a_time, cpu) == pytest.approx(4.0)
    assert held_before.numel() == 4 << 20


def test_the_bench_table_shows_each_call_s_tensors_beside_its_time(tmp_path):
    """Bench rows with ``infer_tensors_mb`` and ``train_tensors_mb`` get a column each, with the ratio to timm's ViT
    (inference) and to the training baseline; a model left out of the training steps reads 'not timed'."""
    from lab.commands.report import bench_block

    rows = {"timm_ape": {"infer_ms": 10.0, "infer_tensors_mb": 100.0},
            "ape": {"infer_ms": 10.0, "infer_tensors_mb": 100.0, "train_ratio": 1.0, "train_tensors_mb": 400.0},
            "sape2": {"infer_ms": 13.0, "infer_tensors_mb": 150.0, "train_ratio": 1.45, "train_tensors_mb": 600.0,
                      "train_round_ratios": [1.4, 1.6]},
            "liere": {"infer_ms": 30.0, "infer_tensors_mb": 120.0}}
    bench = {"provenance": {"command": "python -m lab bench", "commit": "abc"}, "device": "CPU",
             "dtype": "torch.float32", "batch_size": 2, "repeats": 6,
             "runs": [{"size": "s", "resolution": 448, "rows": rows, "train_baseline": "ape", "train_batch_size": 4}]}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    table = bench_block(tmp_path, "bench.json")
    assert "| inference MB of tensors (× timm APE) |" in table and "| train step MB of tensors (× `ape`) |" in table
    assert "| `sape2` | 13.0 | 1.300 | 150.0 (1.50) |  | 1.450 (1.40-1.60) | 600.0 (1.50) |" in table
    assert "| `liere` | 30.0 | 3.000 | 120.0 (1.20) |  | not timed | not timed |" in table
    assert "MB of tensors: the peak of the tensors one call allocated" in table


def test_a_bench_at_several_resolutions_is_a_sweep_against_tokens(tmp_path):
    """``lab bench --resolutions 224,448`` of one size: its table gives every model's time and tensors over timm's ViT
    at each resolution and their growth in tokens, and its plot is the sweep's; one resolution is not a sweep."""
    from lab.commands import bench
    from lab.commands.report import bench_sweep_block

    def rows(scale: float) -> dict:
        return {"timm_ape": {"infer_ms": 10.0 * scale, "infer_tensors_mb": 10.0 * scale},
                "sape2": {"infer_ms": 13.0 * scale, "infer_tensors_mb": 10.0 * scale * scale}}

    runs = [{"size": "s", "resolution": 448, "rows": rows(4.0)}, {"size": "s", "resolution": 224, "rows": rows(1.0)}]
    report = {"provenance": {"command": "python -m lab bench", "commit": "abc"}, "device": "CPU",
              "dtype": "torch.float32", "batch_size": 1, "repeats": 3, "runs": runs}
    (tmp_path / "sweep.json").write_text(json.dumps(report))
    table = bench_sweep_block(tmp_path, "sweep.json")
    tokens = math.log((28**2 + 1) / (14**2 + 1))
    assert "| model | 224 px | 448 px | growth in tokens |" in table
    assert f"| `sape2` | 1.30 | 1.30 | {math.log(4) / tokens:.2f} |" in table  # time: as timm's ViT grows
    assert f"| `sape2` | 1.00 | 4.00 | {math.log(16) / tokens:.2f} |" in table  # tensors: faster
    bench.plot(report, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    assert bench.sweeps(dict(report, runs=runs[:1])) == {}


def test_the_memory_probe_interleaves_rounds_and_keeps_medians(tmp_path, monkeypatch):
    """`python -m lab memory --rounds N` measures every cell N times, a round of every encoding at a time (the
    baseline first), and keeps each number's median over the rounds with the rounds' own; its table says so. Fewer
    than one round is refused by name."""
    from lab.commands import memory
    from lab.commands.report import memory_block

    order = []
    times = iter([1.0, 2.0, 5.0, 1.5, 1.2, 3.0])  # ape, alibi, ape, alibi, ape, alibi

    def cell(command: list[str], env: dict[str, str]) -> dict[str, float]:
        order.append("alibi" if "'alibi'" in command[-1] else "ape")
        return dict(peak_mb=10.0 * len(order), tensors_mb=1.0, time_s=next(times), first_s=0.1)

    parser, run = fake_memory_run(monkeypatch, tmp_path, cell)
    rows = run(["--encodings", "alibi,ape", "--resolutions", "32", "--rounds", "3"])["rows"]
    assert order == ["ape", "alibi"] * 3
    assert rows["ape"]["32"]["time_s"] == 1.2 and rows["alibi"]["32"]["time_s"] == 2.0
    assert rows["alibi"]["32"]["round_time_s"] == [2.0, 1.5, 3.0] and rows["alibi"]["32"]["peak_mb"] == 40.0
    assert "3 interleaved rounds" in memory_block(tmp_path, "memory.json")
    with pytest.raises(ValueError, match="--rounds"):
        memory.run(parser.parse_args(["--rounds", "0"]))
