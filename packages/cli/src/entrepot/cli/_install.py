"""The `pip install` commands the `rl` CLI prints (`rl doctor`), taken from the packages that need them.

The entrepot packages are not on PyPI yet: they install from the checkout's folders (the root
README's command 1), so a command names a package's folder relative to the repository root and
says to run it there. Each command comes from the `_install` module of the package whose messages
print it (`entrepot.grpo._install.install_command`), so that `rl doctor` and `rl grpo config
validate` name the same command for the same extra. Imported by commands only (it imports grpo).
packages/cli/tests/test_install_hints.py checks that each folder exists and each extra is declared.
"""

from __future__ import annotations

from entrepot.grpo._install import install_command
from entrepot.resharding import _install as resharding_install

__all__ = ["COMMANDS", "EXTRA_COMMANDS"]

# The optional module `rl doctor` looks for -> the command that installs it.
EXTRA_COMMANDS: dict[str, str] = {
    "megatron.core": install_command("megatron.core"),
    "vllm": install_command("vllm"),
    "vllm_ascend": resharding_install.pip_install("npu"),
    "torch_npu": resharding_install.pip_install("npu"),
    "tensorboard": install_command("tensorboard"),
    "gguf": install_command("gguf"),
}

# Every command a message of this package prints (the test reads this).
COMMANDS = tuple(EXTRA_COMMANDS.values())
