"""Corruption matrix of checkpoints: damage is a CheckpointError naming the file, never a resume.

A two-step run (in this process, checkpoints after steps 1 and 2) is damaged in copies:
- `read_checkpoint` of step_000002, for each of its 8 files (model, reference, optimizer, rng, dock.pt
  and its own manifest, state.json, manifest.json): 8 seeded single-bit flips and truncations to 0,
  half and size - 1 bytes, plus the manifest deleted: 89 cases, each a CheckpointError (naming the
  file, for the data files), silent 0 (asserted; printed with -s);
- `train(..., resume=True)` with a bit flip in model / optimizer / rng / dock.pt / state.json and a
  truncated model: CheckpointError naming the file, no step trained, no checkpoint written;
- a save stopped half-way (step_000003.tmp/, and step_000003/ without manifest.json) is skipped and
  the resume continues from step_000002.
On the code before manifests every one of these resumed or loaded without a word.

Foreign checkpoints (another run's, of another seed: copied over step_000002, added as a newer
step_000003, linked in as step_000003) and run folders with a symbolic link (metrics.jsonl pointing
outside, the checkpoints folder) are refused by `train(..., resume=True)` before anything starts:
CheckpointError naming the file and both runs, nothing trained, nothing written, the file outside
untouched. The unit tier's test_run_resume.py has the whole matrix (15 ways), built without training;
before run identities each of these trained from the foreign weights (or wrote through the link).
A resume also stops the processes the run's killed Ray session left (a stand-in process here).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from entrepot.grpo import load_config, train
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.errors import CheckpointError
from entrepot.grpo.run import checkpoint as ckpt
from entrepot.grpo.run.metrics import read_metrics

pytestmark = pytest.mark.integration  # training runs

SMALL = ["eval.num_prompts=16", "logging.tensorboard=false", "checkpoint.keep_last=0", "eval.every=0",
         "resources.use_ray=false", "rollout.prompts_per_step=4", "checkpoint.save_every=1"]  # fmt: skip
FLIPS_PER_FILE = 8


def _config(max_steps: int) -> GRPOConfig:
    return load_config(None, [*SMALL, f"max_steps={max_steps}"])


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of two steps with a checkpoint after each."""
    run = tmp_path_factory.mktemp("integrity") / "run"
    train(_config(2), run)
    return run


@pytest.fixture(scope="module")
def other_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another run (another seed) of three steps: the source of foreign checkpoints."""
    run = tmp_path_factory.mktemp("other") / "run"
    train(load_config(None, [*SMALL, "max_steps=3", "seed=1"]), run)
    return run


@pytest.fixture
def run(two_steps: Path, tmp_path: Path) -> Path:
    """A copy of the two-step run to damage."""
    return Path(shutil.copytree(two_steps, tmp_path / "run"))


def _flip(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def _steps(run: Path) -> list[int]:
    return [int(r["step"]) for r in read_metrics(run / "metrics.jsonl")]


def _run_id(run: Path) -> str:
    return str(json.loads((run / "run.json").read_text())["run_id"])


def test_a_checkpoint_lists_every_file_in_its_manifest(two_steps: Path) -> None:
    directory = two_steps / "checkpoints" / "step_000002"
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["algorithm"] == "sha256"
    listed = {entry["path"]: entry["size"] for entry in manifest["files"]}
    on_disk = {p.name: p.stat().st_size for p in directory.iterdir() if p.name != "manifest.json"}
    assert listed == on_disk and "dock.pt" in listed and "model.safetensors" in listed
    assert ckpt.checkpoint_step(two_steps) == 2
    assert not list((two_steps / "checkpoints").glob("*.tmp"))


def test_every_damaged_file_fails_read_checkpoint(run: Path) -> None:
    directory = run / "checkpoints" / "step_000002"
    files = sorted(p.name for p in directory.iterdir())
    assert len(files) == 8, files
    rng = random.Random(7)
    tried = caught = silent = 0
    for name in files:
        path = directory / name
        good = path.read_bytes()
        truncations: list[int | None] = [0, len(good) // 2, len(good) - 1]
        for size in [None] * FLIPS_PER_FILE + truncations:  # None: a bit flip
            if size is None:
                _flip(path, rng)
            else:
                path.write_bytes(good[:size])
            tried += 1
            try:
                ckpt.read_checkpoint(directory, 0)
            except CheckpointError as error:
                caught += 1
                if not name.endswith("manifest.json"):  # a damaged manifest may name a file it lists
                    assert name in str(error) and "step_000002" in str(error), str(error)
            else:
                silent += 1
            path.write_bytes(good)
    (directory / "manifest.json").unlink()
    tried += 1
    with pytest.raises(CheckpointError, match=r"step_000002' has no manifest\.json: it is incomplete"):
        ckpt.read_checkpoint(directory, 0)
    caught += 1
    print(f"\ncheckpoint files: tried {tried}, caught {caught}, silent {silent}")
    assert silent == 0 and caught == tried == 8 * (FLIPS_PER_FILE + 3) + 1


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("model.safetensors", "flip"),
        ("optimizer.safetensors", "flip"),
        ("rng.safetensors", "flip"),
        ("dock.pt", "flip"),
        ("state.json", "flip"),
        ("model.safetensors", "truncate"),
    ],
)
def test_a_damaged_checkpoint_is_never_resumed(run: Path, name: str, damage: str) -> None:
    path = run / "checkpoints" / "step_000002" / name
    if damage == "flip":
        _flip(path, random.Random(name))
    else:
        path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(
        CheckpointError, match=rf"step_000002'?: {re.escape(name)} (does not match|is \d+ bytes)"
    ):
        train(_config(3), run, resume=True)
    assert _steps(run) == [1, 2]  # nothing trained
    assert not (run / "checkpoints" / "step_000003").exists()


def test_evaluate_verifies_the_checkpoint_too(run: Path) -> None:
    from entrepot.grpo import evaluate

    _flip(run / "checkpoints" / "step_000002" / "model.safetensors", random.Random(1))
    with pytest.raises(CheckpointError, match=r"model\.safetensors does not match its sha256"):
        evaluate(run, num_prompts=4)


def test_a_save_stopped_half_way_is_skipped_and_the_previous_checkpoint_resumed(run: Path) -> None:
    root = run / "checkpoints"
    shutil.copytree(root / "step_000002", root / "step_000003.tmp")  # killed before its rename
    shutil.copytree(root / "step_000002", root / "step_000004")  # killed before its manifest
    (root / "step_000004" / "manifest.json").unlink()
    (root / "step_000002" / "manifest.json").unlink()  # and the newest real one is unfinished too
    assert ckpt.latest_checkpoint(run) == root / "step_000001"
    assert ckpt.checkpoint_step(run) == 1
    lines: list[str] = []
    result = train(_config(2), run, resume=True, on_startup=lines.append)
    assert json.loads((run / "resumed_from.json").read_text())["step"] == 1
    assert (
        "skipping step_000002, step_000003.tmp, step_000004 (no manifest.json: a save that was stopped)"
        in lines
    )
    assert [m["step"] for m in result.history] == [2] and _steps(run) == [1, 2]
    assert (root / "step_000002" / "manifest.json").is_file()  # step 2 was written again, whole
    ckpt.verify_checkpoint(root / "step_000002")


def test_a_run_whose_checkpoints_all_lack_a_manifest_says_so(run: Path) -> None:
    for directory in (run / "checkpoints").iterdir():
        (directory / "manifest.json").unlink()
    with pytest.raises(
        CheckpointError, match=r"no complete checkpoint; \['step_000001', 'step_000002'\] lack"
    ):
        train(_config(3), run, resume=True)


def _copy_over(source: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)


def _step(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:06d}"


FOREIGN: dict[str, Callable[[Path, Path], None]] = {
    "copied over": lambda run, other: _copy_over(_step(other, 2), _step(run, 2)),
    "added as newer": lambda run, other: _copy_over(_step(other, 3), _step(run, 3)),
    "symlinked in": lambda run, other: _step(run, 3).symlink_to(_step(other, 3)),
}


@pytest.mark.parametrize("way", FOREIGN)
def test_a_foreign_checkpoint_is_never_resumed(run: Path, other_run: Path, way: str) -> None:
    FOREIGN[way](run, other_run)
    before = sorted(p.name for p in run.iterdir())
    lines: list[str] = []
    with pytest.raises(CheckpointError) as caught:
        train(_config(4), run, resume=True, on_startup=lines.append)
    message = str(caught.value)
    if way == "symlinked in":
        assert f"holds a symbolic link: checkpoints/step_000003 -> {other_run}" in message
    else:
        step = "step_000002" if way == "copied over" else "step_000003"
        assert f"checkpoint {str(run / 'checkpoints' / step)!r} belongs to another run" in message
        assert _run_id(run) in message and _run_id(other_run) in message
    assert lines == []  # refused before anything started
    assert _steps(run) == [1, 2] and sorted(p.name for p in run.iterdir()) == before


@pytest.mark.parametrize("name", ["metrics.jsonl", "checkpoints"])
def test_a_link_in_the_run_folder_is_never_written_through(run: Path, tmp_path: Path, name: str) -> None:
    outside = Path(shutil.copytree(run / "checkpoints", tmp_path / "elsewhere"))
    shutil.copy(run / "metrics.jsonl", outside / "metrics.jsonl")
    if name == "metrics.jsonl":
        (run / name).unlink()
        (run / name).symlink_to(outside / "metrics.jsonl")
    else:
        shutil.rmtree(run / name)
        (run / name).symlink_to(outside, target_is_directory=True)
    files = {p.name: p.stat().st_mtime_ns for p in outside.rglob("*")}
    with pytest.raises(CheckpointError, match=rf"holds a symbolic link: {name} -> {outside}"):
        train(_config(4), run, resume=True)
    assert {p.name: p.stat().st_mtime_ns for p in outside.rglob("*")} == files  # nothing written there


def test_a_resume_stops_what_the_killed_run_left_of_its_ray(run: Path, tmp_path: Path) -> None:
    """A stand-in for a leftover Ray process (its output in the session's logs), and one of another
    session: the resume stops the first only. The recorded driver is a process that has exited."""
    session, elsewhere = tmp_path / "session_1", tmp_path / "session_2"
    for folder in (session / "logs", elsewhere / "logs"):
        folder.mkdir(parents=True)
    driver = subprocess.Popen(["true"])
    driver.wait()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    record = {"session_dir": str(session), "driver_pid": driver.pid, "driver_started": 1, "boot_id": boot}
    (run / "ray_session.json").write_text(json.dumps(record))
    with (session / "logs/raylet.out").open("w") as ours, (elsewhere / "logs/raylet.out").open("w") as theirs:
        leftover = subprocess.Popen(["sleep", "120"], stdout=ours)
        other = subprocess.Popen(["sleep", "120"], stdout=theirs)
    try:
        lines: list[str] = []
        train(_config(3), run, resume=True, on_startup=lines.append)
        assert leftover.wait(5) != 0 and other.poll() is None
        assert lines[0] == f"stopped 1 process(es) left by the run's killed Ray session: {leftover.pid} sleep"
        assert not (run / "ray_session.json").exists()
    finally:
        for process in (leftover, other):
            process.kill()
            process.wait()
