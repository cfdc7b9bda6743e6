"""The code sandbox: run a Python program against its tests in a limited, isolated child process.

`run_program` runs one, `run_many` a batch on a bounded thread pool; each ends in a `Verdict` (pass,
fail, timeout, crash, memory, syntax) with the tests passed. `isolation()` says whether this machine
lets the sandbox cut the program off from the network, the filesystem and other processes (see
docs/sandbox.md for what it protects against, and what not).
"""

from entrepot.grpo.sandbox.isolation import Isolation, isolation
from entrepot.grpo.sandbox.limits import SandboxLimits
from entrepot.grpo.sandbox.runner import run_many, run_program
from entrepot.grpo.sandbox.verdicts import SandboxResult, Verdict

__all__ = ["Isolation", "SandboxLimits", "SandboxResult", "Verdict", "isolation", "run_many", "run_program"]
