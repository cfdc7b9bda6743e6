"""A resume continues only from the run's own checkpoints (`run.resume`, `run.identity`): unit tier.

Runs are built directly, with no training: `identity.create_run` and `write_checkpoint` of a
four-element tensor per file. The foreign-checkpoint matrix damages copies of run A with checkpoints
of run B (another config) and run C (A's config, another run): copied over one of A's, added as a
newer ``step_*``, linked in, the whole checkpoints folder linked, A's own checkpoint renamed or
linked to another step, another run's run.json, a checkpoint without an identity (format 1). Every
way is a CheckpointError naming the file (and both identities), before anything starts: caught ==
tried. Before run identities every one of them was resumed from without a word.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from entrepot.grpo import load_config
from entrepot.grpo.config import GRPOConfig, LoggingConfig
from entrepot.grpo.errors import CheckpointError, GRPOConfigError
from entrepot.grpo.run import metrics as metrics_module
from entrepot.grpo.run.checkpoint import write_checkpoint
from entrepot.grpo.run.identity import RUN_FILE, check_new_run_folder, create_run, read_run
from entrepot.grpo.run.manifest import read_manifest
from entrepot.grpo.run.metrics import MetricsWriter, is_measured
from entrepot.grpo.run.resume import resume_point

CONFIG = load_config(None, ["max_steps=10"])
OTHER = load_config(None, ["max_steps=10", "seed=1"])


def _state(step: int) -> dict[str, object]:
    weights = {"w": torch.full((4,), float(step))}
    return {"model": weights, "reference": {"w": torch.zeros(4)}, "optimizer": {"0.exp_avg": torch.ones(4)},
            "rng": {"torch": torch.zeros(8, dtype=torch.uint8)},
            "json": {"param_groups": [], "scheduler": {}}}  # fmt: skip


def _write(run: Path, step: int) -> Path:
    """Checkpoint `step` of the run in `run` (its identity from run.json)."""
    directory = run / "checkpoints" / f"step_{step:06d}"
    meta = {"step": step, "data_position": 4 * step}
    return write_checkpoint(directory, [_state(step)], meta, owner=read_run(run))


def _make_run(run: Path, config: GRPOConfig, steps: range) -> Path:
    run.mkdir(parents=True)
    create_run(run, config)
    for step in steps:
        _write(run, step)
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run a (CONFIG, steps 1-2), run b (OTHER, steps 1-3), run c (CONFIG again, steps 1-3)."""
    root = tmp_path_factory.mktemp("runs")
    return {
        "a": _make_run(root / "a", CONFIG, range(1, 3)),
        "b": _make_run(root / "b", OTHER, range(1, 4)),
        "c": _make_run(root / "c", CONFIG, range(1, 4)),
    }


def _copy(source: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)


def _link(source: Path, target: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    target.symlink_to(source, target_is_directory=True)


def _format_1(a: Path, runs: dict[str, Path]) -> None:
    """A's step 2 again as step 3, its manifest without run and step (as entrepot-grpo 0.3.0 wrote)."""
    target = a / "checkpoints" / "step_000003"
    _copy(a / "checkpoints" / "step_000002", target)
    manifest = json.loads((target / "manifest.json").read_text())
    (target / "manifest.json").write_text(json.dumps({**manifest, "format": 1, "run": None, "step": None}))


def _ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:06d}"


# name -> (damage to run a, given every run; whose identity the message must name besides a's)
FOREIGN: dict[str, tuple[Callable[[Path, dict[str, Path]], None], str | None]] = {
    "copied over the newest": (lambda a, r: _copy(_ckpt(r["b"], 2), _ckpt(a, 2)), "b"),
    "copied over the newest, another step": (lambda a, r: _copy(_ckpt(r["b"], 1), _ckpt(a, 2)), "b"),
    "added as newer": (lambda a, r: _copy(_ckpt(r["b"], 3), _ckpt(a, 3)), "b"),
    "added as newer, another step's name": (lambda a, r: _copy(_ckpt(r["b"], 1), _ckpt(a, 7)), "b"),
    "same config, copied over": (lambda a, r: _copy(_ckpt(r["c"], 2), _ckpt(a, 2)), "c"),
    "same config, added as newer": (lambda a, r: _copy(_ckpt(r["c"], 3), _ckpt(a, 3)), "c"),
    "symlinked in as newer": (lambda a, r: _link(_ckpt(r["b"], 3), _ckpt(a, 3)), None),
    "symlinked over the newest": (lambda a, r: _link(_ckpt(r["b"], 2), _ckpt(a, 2)), None),
    "same config, symlinked in": (lambda a, r: _link(_ckpt(r["c"], 3), _ckpt(a, 3)), None),
    "checkpoints folder symlinked": (lambda a, r: _link(r["b"] / "checkpoints", a / "checkpoints"), None),
    "own checkpoint copied as newer": (lambda a, r: _copy(_ckpt(a, 1), _ckpt(a, 3)), None),
    "own checkpoint symlinked as newer": (lambda a, r: _ckpt(a, 3).symlink_to("step_000001"), None),
    "another run's run.json": (lambda a, r: shutil.copy(r["b"] / RUN_FILE, a / RUN_FILE), "b"),
    "run.json removed": (lambda a, r: (a / RUN_FILE).unlink(), None),
    "a checkpoint without identity (format 1) added": (_format_1, None),
}


def test_an_untouched_run_resumes_from_its_newest_checkpoint(runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "a"
    shutil.copytree(runs["a"], run)  # a whole run folder copied is the same run
    point = resume_point(run, CONFIG)
    assert (point.directory.name, point.step, point.owner) == ("step_000002", 2, read_run(runs["a"]))
    manifest = read_manifest(point.directory)
    assert manifest.owner == point.owner and manifest.step == 2
    assert resume_point(run, load_config(None, ["max_steps=99", "eval.every=1"])).step == 2  # not fixed


def test_every_foreign_checkpoint_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    tried = caught = 0
    for index, (way, (damage, other)) in enumerate(FOREIGN.items()):
        run = tmp_path / f"a{index}"
        shutil.copytree(runs["a"], run, symlinks=True)
        damage(run, runs)
        tried += 1
        try:
            resume_point(run, CONFIG)
        except CheckpointError as error:
            message = str(error)
            assert str(run) in message, (way, message)  # names the file: the checkpoint or the link
            if other is not None:  # both identities
                ids = {read_run(runs["a"]).run_id, read_run(runs[other]).run_id}
                assert all(i in message for i in ids), (way, message)
            caught += 1
        else:
            print(f"not caught: {way}")
    print(f"\nforeign checkpoints: tried {tried}, caught {caught}")
    assert caught == tried == len(FOREIGN)


def test_a_foreign_checkpoint_names_the_file_and_both_runs(runs: dict[str, Path], tmp_path: Path) -> None:
    run = Path(shutil.copytree(runs["a"], tmp_path / "a"))
    _copy(_ckpt(runs["b"], 3), _ckpt(run, 3))
    a, b = read_run(runs["a"]), read_run(runs["b"])
    with pytest.raises(CheckpointError) as caught:
        resume_point(run, CONFIG)
    assert str(caught.value) == (
        f"checkpoint {str(_ckpt(run, 3))!r} belongs to another run: its manifest.json says run {b.run_id} "
        f"(config {b.config_hash[:12]}), this run folder's run.json says run {a.run_id} (config "
        f"{a.config_hash[:12]}); remove it and resume again (the resume then continues from the run's "
        "newest own checkpoint), or start a new run from its weights (model.path at an exported model "
        "directory)"
    )
    shutil.rmtree(_ckpt(run, 3))  # as the message says
    assert resume_point(run, CONFIG).step == 2


def test_a_renamed_checkpoint_names_both_steps(runs: dict[str, Path], tmp_path: Path) -> None:
    run = Path(shutil.copytree(runs["a"], tmp_path / "a"))
    _copy(_ckpt(run, 1), _ckpt(run, 3))
    named = r"step_000003' is step 1 of run \w+ \(config \w+\) \(step_000001 in its manifest\.json\)"
    with pytest.raises(CheckpointError, match=named):
        resume_point(run, CONFIG)


@pytest.mark.parametrize("name", ["metrics.jsonl", "checkpoints", "tensorboard"])
def test_a_link_in_the_run_folder_is_refused(name: str, runs: dict[str, Path], tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "metrics.jsonl").write_text('{"step": 1}\n')
    run = Path(shutil.copytree(runs["a"], tmp_path / "a"))
    if name == "metrics.jsonl":
        (run / name).symlink_to(outside / "metrics.jsonl")
    else:
        _link(outside, run / name)
    with pytest.raises(CheckpointError, match=rf"holds a symbolic link: {name} -> {outside}"):
        resume_point(run, CONFIG)
    with pytest.raises(CheckpointError, match="holds a symbolic link"):
        check_new_run_folder(run)


def test_the_run_folder_itself_may_be_a_link(runs: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "latest").symlink_to(runs["a"], target_is_directory=True)
    assert resume_point(tmp_path / "latest", CONFIG).step == 2


def test_a_resume_that_changes_a_fixed_key_names_it(runs: dict[str, Path]) -> None:
    changed = load_config(None, ["max_steps=10", "seed=3", "algorithm.lr=0.5", "model.num_layers=3"])
    with pytest.raises(GRPOConfigError) as caught:
        resume_point(runs["a"], changed)
    message = str(caught.value)
    assert "would change what its checkpoints were trained with: algorithm.lr (0.001 -> 0.5), " in message
    assert "model.num_layers (2 -> 3), seed (0 -> 3); these keys are fixed for a run (seed, model," in message


def test_a_key_the_run_did_not_record_is_not_compared(tmp_path: Path) -> None:
    """A run started by an earlier version lacks keys added since (their defaults keep its behaviour)."""
    run = _make_run(tmp_path / "old", CONFIG, range(0))
    record = json.loads((run / RUN_FILE).read_text())
    del record["fixed"]["model"]["init_std"]
    del record["fixed"]["seed"]
    record["config_hash"] = hashlib.sha256(json.dumps(record["fixed"], sort_keys=True).encode()).hexdigest()
    (run / RUN_FILE).write_text(json.dumps(record))
    _write(run, 1)
    assert resume_point(run, load_config(None, ["seed=5", "model.init_std=0.5"])).step == 1


def test_an_edited_run_json_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    run = Path(shutil.copytree(runs["a"], tmp_path / "a"))
    record = json.loads((run / RUN_FILE).read_text())
    record["fixed"]["seed"] = 7
    (run / RUN_FILE).write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match=r"run\.json's fixed config does not match its config_hash"):
        resume_point(run, CONFIG)


def test_a_new_run_refuses_a_folder_that_holds_one(runs: dict[str, Path]) -> None:
    with pytest.raises(CheckpointError, match=r"already holds a run \(run\.json\): resume it"):
        create_run(runs["a"], CONFIG)


def test_nothing_to_resume_is_still_said(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "empty", CONFIG, range(0))
    with pytest.raises(CheckpointError, match=r"nothing to resume: .* has no checkpoints/step_\* directory"):
        resume_point(run, CONFIG)


def test_measured_keys_are_seconds_rates_and_memory() -> None:
    measured = ["time/step", "time/startup", "memory/rollout_peak_bytes", "tokens_per_s",
                "dock/actor_train/wait_s", "reshard/seconds", "reshard/gbps"]  # fmt: skip
    computed = ["reward_mean", "dock/actor_train/rows", "dock/actor_train/bytes", "reshard/bytes", "kl",
                "response_length_max", "data/prompts_drawn", "lr", "grad_norm"]  # fmt: skip
    assert [k for k in measured if not is_measured(k)] == [] and [k for k in computed if is_measured(k)] == []


def test_truncate_hides_repeated_steps_in_tensorboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[int | None] = []

    class Writer:
        def __init__(self, purge_step: int | None) -> None:
            opened.append(purge_step)

        def add_scalar(self, key: str, value: float, step: int) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(metrics_module, "_tensorboard_writer", lambda d, purge_step=None: Writer(purge_step))
    writer = MetricsWriter(tmp_path, LoggingConfig(tensorboard=True))
    for step in (1, 2, 3):
        writer.write({"step": step, "reward_mean": 0.5})
    writer.truncate(2)
    assert opened == [None, 3]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]


def test_write_checkpoint_records_the_run_and_the_step(runs: dict[str, Path]) -> None:
    manifest = json.loads((_ckpt(runs["b"], 3) / "manifest.json").read_text())
    owner = read_run(runs["b"])
    assert manifest["format"] == 2 and manifest["step"] == 3
    assert manifest["run"] == {"id": owner.run_id, "config_hash": owner.config_hash}
    assert os.path.isfile(runs["b"] / RUN_FILE) and owner != read_run(runs["c"])
    assert read_run(runs["a"]).config_hash == read_run(runs["c"]).config_hash  # same config, other run
