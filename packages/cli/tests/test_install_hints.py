"""Every `pip install` command a message prints works from a checkout: folder exists, extra declared.

The entrepot packages are not on PyPI, so a hint naming a distribution (`entrepot-grpo[megatron]`)
fails with "No matching distribution found". Each package renders its hints in its `_install`
module and lists them in `COMMANDS`; these tests read those lists (and the shipped configs' comments)
and check each `"./packages/<name>[<extras>]"` against packages/<name>/pyproject.toml.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("batching", "dock", "resharding", "grpo", "cli")
# The packages whose messages print install commands (each has an `_install` module).
WITH_HINTS = ("dock", "resharding", "grpo", "cli")
FROM_ROOT = "(from the repository root)"
# A checkout folder as pip takes it: "./packages/grpo[megatron]" (quoted for the shell).
LOCAL_REQUIREMENT = re.compile(r'"\./packages/(?P<package>[a-z]+)\[(?P<extras>[a-z0-9,-]+)\]"')


def _commands() -> list[tuple[str, str]]:
    """(package, command) for every command in every package's `_install.COMMANDS`."""
    found = []
    for package in WITH_HINTS:
        module = importlib.import_module(f"entrepot.{package}._install")
        found += [(package, command) for command in module.COMMANDS]
    return found


def _declared_extras(package: str) -> set[str]:
    pyproject = ROOT / "packages" / package / "pyproject.toml"
    with pyproject.open("rb") as file:
        return set(tomllib.load(file)["project"].get("optional-dependencies", {}))


def _problems(command: str) -> list[str]:
    """What is wrong with `command`: a missing folder, an undeclared extra, a distribution name."""
    local = list(LOCAL_REQUIREMENT.finditer(command))
    if not local:
        # a third-party PyPI package (tensorboard); an entrepot one must come from the checkout
        return [f"names an entrepot distribution, not a folder: {command}"] if "entrepot" in command else []
    problems = [] if FROM_ROOT in command else [f"does not say to run it {FROM_ROOT}: {command}"]
    for match in local:
        package = match["package"]
        if package not in PACKAGES or not (ROOT / "packages" / package / "pyproject.toml").is_file():
            problems.append(f"./packages/{package} is not a package folder of this checkout: {command}")
            continue
        for extra in match["extras"].split(","):
            if extra not in _declared_extras(package):
                problems.append(f"{package} declares no extra {extra!r}: {command}")
    return problems


@pytest.mark.parametrize(("package", "command"), _commands())
def test_every_install_command_names_a_folder_and_a_declared_extra(package: str, command: str) -> None:
    assert _problems(command) == []


def test_the_check_refuses_a_distribution_name_a_missing_folder_and_an_undeclared_extra() -> None:
    assert _problems('pip install "entrepot-grpo[megatron]"')
    assert _problems(f'pip install "./packages/nowhere[megatron]" {FROM_ROOT}')
    assert _problems(f'pip install "./packages/grpo[no-such-extra]" {FROM_ROOT}')
    assert _problems('pip install "./packages/grpo[megatron]"')  # says not where to run it
    assert _problems(f'pip install "./packages/grpo[megatron,lora]" {FROM_ROOT}') == []


def test_the_shipped_configs_comments_give_working_commands() -> None:
    commands = [
        line
        for config in sorted((ROOT / "packages" / "cli" / "configs").glob("*.yaml"))
        for line in config.read_text().splitlines()
        if "pip install" in line
    ]
    assert commands, "the configs that need an extra say which"
    assert [problem for line in commands for problem in _problems(line)] == []


def test_doctor_has_an_install_command_for_every_extra_it_reports() -> None:
    from entrepot.cli._doctor import _EXTRAS
    from entrepot.cli._install import EXTRA_COMMANDS

    assert [module for module, *_ in _EXTRAS] == list(EXTRA_COMMANDS)


def test_no_message_outside_the_install_modules_names_an_entrepot_package_to_install() -> None:
    """A guard: a hint written in place (not through `_install`) escapes the checks above."""
    hint = re.compile(r"pip install\W+(entrepot-|\./packages/|packages/)")
    offenders = [
        f"{source.relative_to(ROOT)}:{number}"
        for package in PACKAGES
        for source in sorted((ROOT / "packages" / package / "src").rglob("*.py"))
        if source.name != "_install.py"
        for number, line in enumerate(source.read_text().splitlines(), start=1)
        if hint.search(line)
    ]
    assert offenders == []


# Each optional module `rl doctor` reports -> a config that needs it (None: no config does, or not one
# `rl grpo config validate` checks on this machine: the NPU modules need an NPU device).
_NEEDED_BY = {
    "megatron.core": "engine.train=megatron",
    "vllm": "engine.rollout=vllm",
    "vllm_ascend": None,
    "torch_npu": None,
    "tensorboard": "logging.tensorboard=true",
    "gguf": None,
}


def _missing(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Make `module` (and its submodules) look uninstalled to `find_spec`, as on a bare machine."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == module or name.startswith(f"{module}.") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize("module", [m for m, override in _NEEDED_BY.items() if override])
def test_doctor_and_validate_name_the_same_command_for_an_extra(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    from entrepot.cli.app import app

    override = _NEEDED_BY[module]
    assert override is not None
    _missing(monkeypatch, module)
    config = tmp_path / "run.yaml"
    config.write_text("max_steps: 1\n")
    validate = runner.invoke(app, ["grpo", "config", "validate", str(config), override])
    assert validate.exit_code == 2, validate.output
    doctor = runner.invoke(app, ["doctor", "-c", str(config), override], env={"COLUMNS": "400"})
    assert doctor.exit_code == 0, doctor.output
    (row,) = [line for line in doctor.stdout.splitlines() if line.strip().startswith(f"{module} ")
              and "to install it: " in line]  # fmt: skip
    doctor_command = row.split("to install it: ", 1)[1].strip()
    assert doctor_command in validate.stderr.replace("\n", " ")


def test_every_extra_of_doctor_is_checked_against_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from entrepot.cli._install import EXTRA_COMMANDS
    from entrepot.grpo.engines import model_import
    from entrepot.grpo.engines.model_import import ModelImportError

    assert list(_NEEDED_BY) == list(EXTRA_COMMANDS)
    _missing(monkeypatch, "gguf")  # `rl model import`'s refusal and doctor's gguf row agree too
    with pytest.raises(ModelImportError) as refused:
        model_import._require_extra()
    assert str(refused.value).endswith(f"not installed: {EXTRA_COMMANDS['gguf']}")
