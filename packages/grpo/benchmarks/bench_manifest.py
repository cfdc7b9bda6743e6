"""What checkpoint manifests cost: hash throughput, and save time with vs without the manifest.

1. Hash throughput of hashlib's algorithms over a 200 MiB file (in the page cache, as a checkpoint
   file is right after it was written): why the manifest uses sha256.
2. `Trainer.save()` of the embedded default run (after one step, in this process), and
   `write_checkpoint` of a 200 MiB model: median seconds with the manifest (hash + fsync of every
   file, fsync of the directories) and without it (the same code with `write_manifest` skipped: what
   a save cost before manifests, when its files could still sit unwritten in the page cache), and
   their ratio. Most of the difference on a large file is the fsync, not the hash.
3. Verifying on resume: `verify_checkpoint` of the same two checkpoints (about the hashing alone).

    python packages/grpo/benchmarks/bench_manifest.py [--repeats 5] [--megabytes 200]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import hashlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from entrepot.grpo import load_config
from entrepot.grpo.run import checkpoint as ckpt

ALGORITHMS = ("sha256", "blake2b", "blake2s", "sha512", "sha3_256", "sha1", "md5")  # sha1 / md5: not strong


def _median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _hash_table(path: Path, repeats: int) -> None:
    size_mb = path.stat().st_size / 2**20
    print(f"\nhash throughput over a {size_mb:.0f} MiB file (page cache), median of {repeats}")
    print(f"{'algorithm':<12}{'seconds':>10}{'MiB/s':>10}{'vs sha256':>11}")
    base = None
    for name in ALGORITHMS:

        def digest(name: str = name) -> None:
            with path.open("rb") as file:
                hashlib.file_digest(file, name)

        seconds = _median_seconds(digest, repeats)
        base = base or seconds
        print(f"{name:<12}{seconds:>10.3f}{size_mb / seconds:>10.0f}{seconds / base:>10.2f}x")


def _with_and_without(save: Callable[[], Path], repeats: int) -> tuple[float, float, Path]:
    """Median seconds of `save` with the manifest and with `write_manifest` skipped; the last directory."""
    real = ckpt.write_manifest
    with_manifest = _median_seconds(save, repeats)
    ckpt.write_manifest = lambda directory, **_: directory / "manifest.json"  # type: ignore[assignment]
    try:
        without = _median_seconds(save, repeats)
    finally:
        ckpt.write_manifest = real
    return with_manifest, without, save()


def _row(name: str, with_manifest: float, without: float, directory: Path, repeats: int) -> None:
    size_mb = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) / 2**20
    verify = _median_seconds(lambda: ckpt.verify_checkpoint(directory), repeats)
    ratio = with_manifest / without
    print(f"{name:<26}{size_mb:>8.1f}{without:>12.3f}{with_manifest:>12.3f}{ratio:>9.2f}x{verify:>11.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--megabytes", type=int, default=200, help="size of the large model, MiB")
    args, _ = parser.parse_known_args()  # nox passes every bench_*.py the same arguments
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as scratch:  # on the disk runs use, not a tmpfs
        root = Path(scratch)
        big = {"weight": torch.randn(args.megabytes * 2**20 // 4)}
        _hash_table(_write_big(root, big), args.repeats)

        from entrepot.grpo.trainer import Trainer
        from entrepot.grpo.workers import ActorWorker, wait_all

        config = load_config(None, ["resources.use_ray=false", "logging.tensorboard=false", "eval.every=0"])
        trainer = Trainer(config, root / "run")
        try:
            trainer.train_step()
            print(f"\ncheckpoint save, median of {args.repeats} (s); ratio = with / without manifest")
            print(f"{'checkpoint':<26}{'MiB':>8}{'without s':>12}{'with s':>12}{'ratio':>10}{'verify s':>11}")
            _row("default run (1 step)", *_with_and_without(trainer.save, args.repeats), args.repeats)
            state = wait_all([trainer.actors.call(ActorWorker.state)], 60)[0][0]  # rank 0's state
        finally:
            trainer.close()
        big_state = {**state, "model": big}
        meta = {"step": 0, "data_position": 0}

        def save_big() -> Path:
            return ckpt.write_checkpoint(root / "big" / "step_000000", [big_state], meta, owner=trainer.owner)

        _row(f"{args.megabytes} MiB model", *_with_and_without(save_big, args.repeats), args.repeats)


def _write_big(root: Path, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    path = root / "big.safetensors"
    save_file(tensors, str(path))
    return path


if __name__ == "__main__":
    main()
