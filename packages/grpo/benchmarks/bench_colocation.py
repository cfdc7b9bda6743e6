"""Peak memory and step time of full co-location: everything resident, everything offloaded, separate workers.

Three runs of the same config (reverse 8 digits; a ~50M-parameter Qwen2-style policy, a ~13M-parameter
Qwen2 sequence-classifier reward model built here and saved into a temporary folder, KL 0.04 to the
reference, two update epochs so that the old-log-prob stage exists), each on Ray:

| run | resources                                  | engine offload flags                             |
|-----|--------------------------------------------|--------------------------------------------------|
| A   | co-located (the baseline)                  | none: every model stays on the device            |
| B   | co-located                                 | params, grads, optimizer, reference, reward model |
| C   | colocate=false, blocking=false             | none (reference and reward model on own workers) |

Printed: each stage's peak memory on the actor ranks (on CPU "tracked" bytes: model state on the
device, see entrepot/grpo/workers/_memory.py), B's peak next to each stage's need from
`estimate_memory`'s exact model sizes (PASS when B's step peak is within one reshard bucket of the
largest need), A / B peak, and the median step time of steps 2+ with the ratios B / A and C / A.

    python packages/grpo/benchmarks/bench_colocation.py [--max-steps 3] [--kl-coef 0.04] [--out DIR]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning OpenMP threads
os.environ.setdefault("OMP_NUM_THREADS", "1")  # made a tiny model 5-10x slower on 2 shared cores

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))  # tests_support_models.byte_tokenizer

MB = 1e6
PHASES = ("rollout", "reward_model", "ref_log_prob", "old_log_prob", "update")
# ~50M parameters: 16 layers of 512 wide with grouped-query attention (8 heads, 2 KV heads)
POLICY = [
    "model.architecture=qwen2",
    "model.hidden_size=512",
    "model.num_layers=16",
    "model.num_heads=8",
    "model.num_kv_heads=2",
    "model.intermediate_size=1536",
    "model.max_positions=32",
]
SMALL_STEPS = [
    "rollout.prompts_per_step=4",
    "rollout.n_samples_per_prompt=2",
    "eval.every=0",
    "eval.num_prompts=8",
    "checkpoint.save_every=0",
    "logging.tensorboard=false",
]
OFFLOAD_ALL = [
    f"engine.offload_{name}=true" for name in ("params", "grads", "optimizer", "reference", "reward_models")
]
RUNS = {
    "A resident": [],
    "B offloaded": OFFLOAD_ALL,
    "C separate": ["resources.colocate=false", "resources.blocking=false"],
}


def build_reward_model(directory: Path) -> Path:
    """A randomly initialised ~13M-parameter Qwen2 sequence classifier (one label) and a byte tokenizer."""
    import torch
    from tests_support_models import byte_tokenizer
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    tokenizer = byte_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=384, intermediate_size=1024, num_hidden_layers=8,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
        num_labels=1, pad_token_id=0, eos_token_id=1, bos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def model_bytes(config: Any) -> dict[str, int]:
    """Bytes per model of the actor rank, from `estimate_memory` (exact parameter counts, nothing built).

    P policy params (= R reference), E the rollout engine's weights, C the copy the train -> rollout
    resharding allocates (tensors it cannot hand over as views of the parameters), M the reward model.
    """
    from entrepot.grpo import estimate_memory

    e = estimate_memory(config)
    return {"P": e.params, "E": e.rollout_weights, "C": e.resharded_copy, "M": e.reward_models}


def run(config: Any, run_dir: Path) -> tuple[list[dict[str, Any]], float]:
    """Train `config` into `run_dir`; its per-step metrics and the wall seconds (start-up included)."""
    from entrepot.grpo import train

    start = time.perf_counter()
    result = train(config, run_dir)
    return result.history, time.perf_counter() - start


def peaks(history: list[dict[str, Any]]) -> dict[str, float]:
    """The last step's peak bytes per phase (absent phases left out) and their max as "step"."""
    last = history[-1]
    found = {p: last[f"memory/{p}_peak_bytes"] for p in PHASES if f"memory/{p}_peak_bytes" in last}
    return {**found, "step": max(found.values())}


def step_time(history: list[dict[str, Any]]) -> float:
    """Median `time/step` over steps 2+ (step 1 pays the first-call costs)."""
    return statistics.median(m["time/step"] for m in history[1:] or history)


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / MB:.1f}"


def print_peaks(rows: dict[str, dict[str, float]]) -> None:
    """The per-phase peak table: one column per run."""
    print("\npeak memory per phase, last step (MB; actor ranks; CPU: tracked model-state bytes)")
    print(f"{'phase':<16}" + "".join(f"{name:>14}" for name in rows))
    for phase in (*PHASES, "step"):
        print(f"{phase:<16}" + "".join(f"{_mb(row.get(phase)):>14}" for row in rows.values()))


def _covers(measured: float, need: int) -> str:
    """Whether a measured peak is the phase's need: equal, or within 1 MB (AdamW's step counters)."""
    diff = measured - need
    if diff == 0:
        return "yes"
    return f"yes ({diff:+.0f} bytes)" if abs(diff) < MB else f"no ({_mb(diff)} MB)"


def print_needs(rows: dict[str, dict[str, float]], sizes: dict[str, int], bucket: int) -> None:
    """Each phase's need from the model bytes next to B's peak; B's step peak against the largest."""
    p, m = sizes["P"], sizes["M"]
    needs = {"rollout": p + sizes["C"] + sizes["E"], "reward_model": m, "ref_log_prob": p,
             "old_log_prob": p, "update": 4 * p}  # fmt: skip
    formulas = {"rollout": "P + C + E", "reward_model": "M", "ref_log_prob": "R = P", "old_log_prob": "P",
                "update": "P + G + 2P = 4P"}  # fmt: skip
    offloaded = rows["B offloaded"]
    print("\nlargest single phase's need (P policy = R reference, E rollout weights, C resharded copy, "
          "M reward model; from estimate_memory)")  # fmt: skip
    print(f"{'phase':<16}{'formula':<18}{'need':>10}{'B peak':>10}  B peak == need?")
    for phase, need in needs.items():
        measured = offloaded.get(phase)
        # on CPU a stage's peak is sampled while its models are on the device and includes the peak of
        # each mode transition in it: B (everything offloaded) should hold exactly what the phase needs
        seen = "-" if measured is None else _covers(measured, need)
        print(f"{phase:<16}{formulas[phase]:<18}{_mb(need):>10}{_mb(measured):>10}  {seen}")
    largest = max(needs.values())
    bound = largest + bucket
    verdict, relation = ("PASS", "<=") if offloaded["step"] <= bound else ("FAIL", ">")
    print(f"{verdict}: B step peak {_mb(offloaded['step'])} MB {relation} max need {_mb(largest)} MB "
          f"+ one reshard bucket {_mb(bucket)} MB = {_mb(bound)} MB")  # fmt: skip
    print(f"A / B step peak: {rows['A resident']['step'] / offloaded['step']:.2f}x")


def print_times(times: dict[str, float]) -> None:
    """Median step seconds per run and the ratios to A."""
    print("\nstep time (median of steps 2+, s)")
    for name, seconds in times.items():
        print(f"  {name:<14}{seconds:>8.3f}")
    base = times["A resident"]
    print(f"B / A: {times['B offloaded'] / base:.2f}x   C / A: {times['C separate'] / base:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--kl-coef", type=float, default=0.04)
    parser.add_argument("--out", type=Path, default=None, help="write colocation.json here")
    args, _ = parser.parse_known_args()  # nox passes every bench_*.py the same arguments

    import ray
    import torch

    from entrepot.grpo import load_config

    torch.set_num_threads(1)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        reward_dir = build_reward_model(Path(tmp) / "reward_model")
        common = [*POLICY, *SMALL_STEPS, f"max_steps={args.max_steps}", f"algorithm.kl_coef={args.kl_coef}",
                  "algorithm.epochs=2", f"reward.models={{{reward_dir}: 1.0}}"]  # fmt: skip
        configs = {name: load_config(None, [*common, *extra]) for name, extra in RUNS.items()}
        sizes = model_bytes(configs["A resident"])
        runs = {name: run(config, Path(tmp) / name.split()[0]) for name, config in configs.items()}
        ray.shutdown()
    total = time.perf_counter() - started
    rows = {name: peaks(history) for name, (history, _) in runs.items()}

    print(f"\nco-location, {args.max_steps} steps each, kl_coef {args.kl_coef}, 2 epochs: policy "
          f"{sizes['P'] / 4e6:.1f}M params ({_mb(sizes['P'])} MB fp32), reward model "
          f"{sizes['M'] / 4e6:.1f}M params ({_mb(sizes['M'])} MB)")  # fmt: skip
    print_peaks(rows)
    print_needs(rows, sizes, configs["B offloaded"].engine.reshard_bucket_mb * 2**20)
    print_times({name: step_time(history) for name, (history, _) in runs.items()})
    print(f"\nwall: {total:.1f} s (" + ", ".join(f"{name} {wall:.1f} s" for name, (_, wall) in runs.items())
          + ")")  # fmt: skip
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        histories = {name: history for name, (history, _) in runs.items()}
        (args.out / "colocation.json").write_text(
            json.dumps({"peaks": rows, "histories": histories}, indent=1)
        )


if __name__ == "__main__":
    main()
