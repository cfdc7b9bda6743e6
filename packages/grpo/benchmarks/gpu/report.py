"""The GPU benchmark's short table and its goals (issue 44), read off the results dict `bench_gpu` writes.

Every ratio is against a baseline measured in the same run: MFU against the bf16 matrix product,
sync and checksum rates against a device-to-device copy of the same bytes.
"""

from __future__ import annotations

from typing import Any

from common import gib

# Issue 44's goals on one H100, same run.
GOAL_TOKENS_PER_S = 12_000
GOAL_VERIFIED_SYNC_S = 0.02
GOAL_SYNC_FRACTION_OF_COPY = 0.5
GOAL_FIRST_STEP_S = 60.0


def _ok(section: Any) -> bool:
    return isinstance(section, dict) and "error" not in section


def _error(name: str, section: Any) -> str:
    if section is None:
        return f"  {name}: not run"
    return f"  {name}: FAILED {section['error'][:300]}"


def _train_lines(results: dict[str, Any]) -> list[str]:
    batch = results["batch"]
    matmul = results.get("matmul", {}).get("flops_per_s")
    lines = [
        f"(a) training step (fwd + bwd + AdamW), {batch['tokens']:,} packed tokens in "
        f"{len(batch['lengths'])} sequences, {batch['scored']:,} scored",
        "  engine     s/step  tokens/s  TFLOP/s  MFU datasheet  MFU vs matmul  peak GiB  attention",
    ]
    for engine in ("torch", "megatron"):
        row = results.get(f"train_{engine}")
        if not _ok(row):
            lines.append(_error(engine, row))
            continue
        mfu = "-" if row["mfu_datasheet"] is None else f"{row['mfu_datasheet']:.1%}"
        vs_matmul = "-" if not matmul else f"{row['flops_per_s'] / matmul:.1%}"
        lines.append(
            f"  {engine:<9} {row['seconds_per_step']:7.3f} {row['tokens_per_s']:9,.0f} "
            f"{row['flops_per_s'] / 1e12:8.1f} {mfu:>14} {vs_matmul:>14} {gib(row['peak_device_bytes']):>9}  "
            f"{row['attention_kernel']}"
        )
    for engine in ("torch", "megatron"):
        row = results.get(f"train_{engine}")
        if _ok(row):
            tflop = row["flops_per_step"] / 1e12
            lines.append(f"  FLOPs = 6 N_body T + 6 V h R + 6 L H d sum s_i^2 = {tflop:.1f} TFLOP per step")
            break
    return lines


def _sync_lines(results: dict[str, Any]) -> list[str]:
    sync = results.get("sync")
    if not _ok(sync):
        return ["(b) weight sync", _error("sync", sync)]
    copy = sync["copy"]
    lines = [
        f"(b) weight sync of {copy['bytes'] / 1e9:.2f} GB ({sync['dtype']}, {sync['train_tensors']} training "
        f"tensors); copy bound {copy['seconds'] * 1e3:.2f} ms ({copy['gb_per_s']:.0f} GB/s)",
        "  path                                                     seconds    GB/s  of copy",
    ]
    for row in sync["rows"]:
        lines.append(
            f"  {row['path']:<55} {row['seconds']:8.4f} {row['gb_per_s']:7.1f} {row['fraction_of_copy']:8.1%}"
        )
    probe = sync["checksum"]
    rate, copy_rate = probe["gb_per_s"], probe["copy_gb_per_s"]
    lines.append(
        f"  checksum: result on {probe['result_device']}, equals the CPU's: {probe['matches_cpu']}; "
        f"{rate:.1f} GB/s on {probe['bytes'] / 1e6:.0f} MB (copy {copy_rate:.0f} GB/s, "
        f"{rate / copy_rate:.1%}); "
        f"{probe['seconds_per_call_2mib'] * 1e6:.0f} us per 2 MiB call"
    )
    return lines


def _memory_lines(results: dict[str, Any]) -> list[str]:
    off, on = results.get("memory_offload_off"), results.get("memory_offload_on")
    lines = ["(c) peak memory per phase, GiB (device peak / host peak RSS), offload keys off vs on"]
    if not (_ok(off) and _ok(on)):
        return [*lines, _error("offload off", off) if not _ok(off) else _error("offload on", on)]
    lines.append("  phase       off: device    host     on: device    host")
    for phase, row_off in off["phases"].items():
        row_on = on["phases"][phase]
        lines.append(
            f"  {phase:<11} {gib(row_off['device_peak']):>11} {gib(row_off['host_peak']):>7} "
            f"{gib(row_on['device_peak']):>14} {gib(row_on['host_peak']):>7}"
        )
    lines.append(f"  idle after the step: device {gib(off['idle_after_step']['device'])} (off) vs "
                 f"{gib(on['idle_after_step']['device'])} (on)")  # fmt: skip
    return lines


def _first_step_lines(results: dict[str, Any]) -> list[str]:
    first = results.get("first_step")
    if not _ok(first):
        return ["(d) time to first step", _error("first_step", first)]
    if first["seconds_to_first_step"] is None:
        return ["(d) time to first step: no step line; log tail in the JSON (first_step.log_tail)"]
    metrics = first["step_metrics"]
    startup, step = metrics.get("time/startup", float("nan")), metrics.get("time/step", float("nan"))
    return [
        f"(d) rl grpo train, command start -> first finished step: {first['seconds_to_first_step']:.1f} s "
        f"(start-up {startup:.1f} s, step {step:.1f} s; model directory and data written before it in "
        f"{first['inputs']['seconds']:.1f} s)"
    ]


def table(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        f"GPU benchmark, shape {results['shape']['name']}, on {env['device']} (torch {env['torch']}, "
        f"megatron-core {env['megatron_core']}, transformers {env['transformers']}), {env['date']}"
    ]
    matmul = results.get("matmul")
    if _ok(matmul):
        peak = results.get("datasheet_peak_flops")
        of_peak = f" ({matmul['flops_per_s'] / peak:.0%} of the datasheet)" if peak else ""
        lines.append(f"bf16 matmul {matmul['size']}^3: {matmul['flops_per_s'] / 1e12:.0f} TFLOP/s{of_peak}")
    attention = results.get("attention")
    if _ok(attention):
        errors = ", ".join(f"{k} {v:.1e}" for k, v in attention["relative_error_vs_sdpa"].items())
        lines.append(
            f"packed attention kernel: {attention['kernel']} (relative error vs the SDPA path: {errors})"
        )
    lines += (
        _train_lines(results) + _sync_lines(results) + _memory_lines(results) + _first_step_lines(results)
    )
    if results.get("goals"):
        lines.append("goals: " + "; ".join(f"{k} {'met' if v else 'MISSED'}" if v is not None else f"{k} n/a"
                                           for k, v in results["goals"].items()))  # fmt: skip
    lines.append(f"total {results['total_seconds']:.0f} s")
    return "\n".join(lines)


def goals(results: dict[str, Any]) -> dict[str, bool | None]:
    """Issue 44's goals, each True / False, or None where its section failed."""
    rates = [results[k]["tokens_per_s"] for k in ("train_torch", "train_megatron") if _ok(results.get(k))]
    sync = results.get("sync")
    verified = next((r for r in sync["rows"] if r["verify"]), None) if _ok(sync) else None
    first = results.get("first_step")
    seconds = first.get("seconds_to_first_step") if _ok(first) else None
    return {
        "training >= 12k tokens/s": max(rates) >= GOAL_TOKENS_PER_S if rates else None,
        "verified sync <= 0.02 s": verified["seconds"] <= GOAL_VERIFIED_SYNC_S if verified else None,
        "verified sync >= 50% of copy": (
            verified["fraction_of_copy"] >= GOAL_SYNC_FRACTION_OF_COPY if verified else None
        ),
        "first step <= 60 s": seconds <= GOAL_FIRST_STEP_S if seconds is not None else None,
    }
