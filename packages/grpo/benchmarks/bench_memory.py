"""Peak RSS per phase of `rl grpo train` with the memory keys off and on, and the estimate beside it.

Each setting runs in its own process (`--child`): a sampler thread reads the process's RSS every
10 ms and files it under the phase running (the trainer's log-prob passes and update, HF generate,
the policy's build; "loop" is the rest: resharding, the end-of-run evaluation's bookkeeping, the
checkpoint and its export). Prints each setting's peaks, the ratio of its whole-run and update
peaks to the first setting's, and `estimate_memory`'s figures for the same config.

    python packages/grpo/benchmarks/bench_memory.py --config smol.yaml   # a model.path config

Without `--config` it measures the default run (the embedded GPT-2), as `nox -s bench-grpo` does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

SETTINGS = {
    "baseline": [],
    "checkpointing": ["engine.activation_checkpointing=true"],
    "checkpointing+bf16 reference": [
        "engine.activation_checkpointing=true",
        "model.reference_dtype=bfloat16",
    ],
}
MIB = 2**20


def _child(out: str, argv: list[str]) -> None:
    """Run `rl` with `argv` in this process, recording the RSS peak of each phase into `out`."""
    page = os.sysconf("SC_PAGE_SIZE")
    phase, peaks = ["startup"], {}

    def sample() -> None:
        while True:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * page
            peaks[phase[0]] = max(peaks.get(phase[0], 0), rss)
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    import entrepot.grpo.engines.policy as policy
    import entrepot.grpo.engines.rollout_hf as rollout_hf
    import entrepot.grpo.engines.train_torch as train_torch
    import entrepot.grpo.workers.actor as actor

    def labelled(f, label):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            before, phase[0] = phase[0], label(kwargs) if callable(label) else label
            try:
                return f(*args, **kwargs)
            finally:
                phase[0] = "loop" if label == "build_policy" else before

        return run

    trainer = train_torch.TorchTrainer
    trainer.update = labelled(trainer.update, "update")
    trainer.logprobs = labelled(
        trainer.logprobs, lambda kw: "ref_logprobs" if kw.get("reference") else "logprobs"
    )
    rollout_hf.HFRolloutEngine.generate = labelled(rollout_hf.HFRolloutEngine.generate, "generate")
    actor.build_policy = policy.build_policy = labelled(policy.build_policy, "build_policy")
    from entrepot.cli.app import main as rl_main

    sys.argv = ["rl", *argv]
    with contextlib.suppress(SystemExit):
        rl_main()
    with open(out, "w") as f:
        json.dump({**peaks, "run": max(peaks.values())}, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a run config (default: the default run)")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--child", nargs=argparse.REMAINDER)
    args, _ = parser.parse_known_args()  # bench-grpo hands every script the same arguments
    if args.child:
        _child(args.child[0], args.child[1:])
        return
    from entrepot.grpo import load_config
    from entrepot.grpo.run.memory import estimate_memory

    with open("/proc/loadavg") as f:
        print(f"load {f.read().split()[:3]}")
    first: dict[str, int] | None = None
    for name, overrides in SETTINGS.items():
        with tempfile.TemporaryDirectory() as runs:
            out = os.path.join(runs, "peaks.json")
            config = ["-c", args.config] if args.config else []
            argv = [
                "grpo",
                "train",
                *config,
                "-o",
                runs,
                "-q",
                f"max_steps={args.steps}",
                *overrides,
            ]
            subprocess.run([sys.executable, __file__, "--child", out, *argv], check=True)
            with open(out) as f:
                peaks = json.load(f)
        first = first or peaks
        estimate = estimate_memory(load_config(args.config, overrides))
        shown = ", ".join(f"{k} {v / MIB:.0f}" for k, v in peaks.items())
        print(f"{name}: MiB {shown}; run {peaks['run'] / first['run']:.2f}x, update "
              f"{peaks['update'] / first['update']:.2f}x the baseline; estimate "
              f"{ {k: round(v[0] / MIB) for k, v in estimate.stages.items()} }")  # fmt: skip


if __name__ == "__main__":
    main()
