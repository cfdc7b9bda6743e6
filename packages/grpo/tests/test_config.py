"""Config loading, overrides and validation errors that name key, value and what is allowed."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest
import torch

from entrepot.grpo import GRPOConfig, GRPOConfigError, dump_yaml, load_config
from entrepot.grpo.config import config_from_dict, config_to_dict


def test_default_is_the_embedded_run() -> None:
    config = load_config()
    assert config == GRPOConfig()
    assert config.rollout.prompts_per_step * config.rollout.n_samples_per_prompt == 256
    assert config.algorithm.kl_coef == 0.04 and config.algorithm.lr == 1e-3


def test_every_field_has_help() -> None:
    def walk(cls: type) -> None:
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"
            if isinstance(f.type, type) and dataclasses.is_dataclass(f.type):
                walk(f.type)

    walk(GRPOConfig)


def test_yaml_round_trip_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    dump_yaml(load_config(None, ["algorithm.kl_coef=0.01", "rollout.n_samples_per_prompt=4"]), path)
    config = load_config(path, ["algorithm.adam_betas=[0.8, 0.9]", "model.path=null"])
    assert config.algorithm.kl_coef == 0.01 and config.rollout.n_samples_per_prompt == 4
    assert config.algorithm.adam_betas == (0.8, 0.9)
    assert config_to_dict(config)["algorithm"]["adam_betas"] == [0.8, 0.9]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.kl_coefficient=1", "unknown key 'algorithm.kl_coefficient'"),
        ("rollout.prompts_per_step=abc", r"rollout.prompts_per_step \('abc'\) must be int"),
        ("algorithm.lr=true", r"algorithm.lr \(True\) must be float"),
        ("algorithm.kl_kind=k9", r"algorithm.kl_kind \('k9'\) must be one of 'k1'"),
        ("rollout.temperature=0", r"rollout.temperature \(0.0\) must be > 0"),
        ("algorithm.mini_batch_size=12", r"algorithm.mini_batch_size \(12\) must be a multiple of"),
        ("nosection.key=1", "unknown section 'nosection'"),
        ("resources.num_actor_workers=3", r"rollout.prompts_per_step \(32\) must be divisible"),
        ("noequals", "must look like section.key=value"),
    ],
)
def test_errors_name_key_value_and_allowed(override: str, message: str) -> None:
    with pytest.raises(GRPOConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.max_positions=12"], r"^model.max_positions \(12\) must be >= 17 \(prompt \+ response"),
        (["data.task=addition", "model.max_positions=26"], r"^model.max_positions \(26\) must be >= 27"),
        (["rollout.max_new_tokens=30"], r"^model.max_positions \(32\) must be >= 39"),
        (["batching.update.max_tokens=4"], r"^batching.update.max_tokens \(4\) must be >= 17, the longest"),
        (
            ["batching.max_tokens_per_micro_batch=16"],
            r"^batching.max_tokens_per_micro_batch \(16\) must be >= 17",
        ),
        (["dock.shards=33"], r"^dock.shards \(33\) must be <= the dock's prompt groups \(32\)"),
        (["rollout.partial_max_tokens=3", "dock.shards=97"], r"^dock.shards \(97\) must be <= .* \(96\)"),
    ],
)
def test_sequences_that_do_not_fit_are_refused_before_a_run(overrides: list[str], message: str) -> None:
    """The task's token lengths are the data wing's: `check_task_fits` (run by preflight) refuses these."""
    from entrepot.grpo.data.checks import check_task_fits
    from entrepot.grpo.run.preflight import check_inputs

    config = load_config(None, overrides)  # each section and their combination is valid
    with pytest.raises(GRPOConfigError, match=message):
        check_task_fits(config)
    with pytest.raises(GRPOConfigError, match=message):
        check_inputs(config)


def test_config_imports_no_other_wing() -> None:
    """The layer rule: config imports errors and itself, never data, engines, run or workers."""
    import ast

    import entrepot.grpo.config as config_package

    for path in Path(config_package.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):  # every import, TYPE_CHECKING blocks and function bodies included
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("entrepot.grpo."):
                wing = node.module.split(".")[2]
                assert wing in ("config", "errors"), f"{path.name} imports {node.module}"


@pytest.mark.parametrize(
    ("override", "nearest", "nearest_in_yaml"),
    [
        ("rollout.max_new_token=8", "rollout.max_new_tokens", None),  # a letter off
        ("rollout.max_tokens=8", "rollout.max_new_tokens", None),  # a word left out
        ("algorithm.max_new_tokens=8", "rollout.max_new_tokens", None),  # the right key, wrong section
        ("lr=0.1", "algorithm.lr", None),
        ("rollouts.temperature=0.5", "rollout.temperature", "rollout"),  # YAML: the section is unknown
    ],
)
def test_a_mistyped_key_names_the_nearest_one(
    tmp_path: Path, override: str, nearest: str, nearest_in_yaml: str | None
) -> None:
    """Both as a dotted override and as a YAML key the error suggests the valid key it is nearest."""
    with pytest.raises(GRPOConfigError, match=rf"\(did you mean '{re.escape(nearest)}'\?\)"):
        load_config(None, [override])
    dotted, value = override.split("=")
    *sections, key = dotted.split(".")
    text = "".join(f"{'  ' * depth}{name}:\n" for depth, name in enumerate(sections))
    (tmp_path / "typo.yaml").write_text(f"{text}{'  ' * len(sections)}{key}: {value}\n")
    nearest = nearest_in_yaml or nearest
    with pytest.raises(GRPOConfigError, match=rf"\(did you mean '{re.escape(nearest)}'\?\)"):
        load_config(tmp_path / "typo.yaml")


def test_a_renamed_key_is_refused_naming_the_new_one(tmp_path: Path) -> None:
    """`algorithm.max_staleness` moved to `trainer.max_staleness`: refused as an override and in YAML."""
    message = re.escape("algorithm.max_staleness was renamed: use trainer.max_staleness")
    with pytest.raises(GRPOConfigError, match=message):
        load_config(None, ["rollout.partial_max_tokens=3", "algorithm.max_staleness=1"])
    (tmp_path / "old.yaml").write_text("algorithm:\n  lr: 0.01\n  max_staleness: 2\n")
    with pytest.raises(GRPOConfigError, match=message):
        load_config(tmp_path / "old.yaml")


def test_a_renamed_key_left_at_null_is_dropped_so_configs_saved_before_load() -> None:
    """Every config a run saved before the rename holds `algorithm.max_staleness: null` (its old default):
    resume, export and eval read them, so a null old key says nothing and is dropped."""
    saved = config_to_dict(load_config(None, []))
    saved["algorithm"]["max_staleness"] = None
    assert config_from_dict(saved) == load_config(None, [])
    assert load_config(None, ["algorithm.max_staleness=null"]) == load_config(None, [])


def test_one_staleness_bound_keeps_each_modes_default() -> None:
    """trainer.max_staleness null: async keeps its bound of 1, partial rollout (and sync) no bound."""
    assert load_config(None, ["trainer.mode=async"]).trainer.async_max_staleness == 1
    lockstep = load_config(None, ["trainer.mode=async", "trainer.max_staleness=0"])
    assert lockstep.trainer.async_max_staleness == 0
    assert load_config(None, ["rollout.partial_max_tokens=3"]).trainer.max_staleness is None
    partial = load_config(None, ["rollout.partial_max_tokens=3", "trainer.max_staleness=2"])
    assert partial.trainer.max_staleness == 2
    with pytest.raises(GRPOConfigError, match=re.escape("trainer.max_staleness (1) must be null without")):
        load_config(None, ["trainer.max_staleness=1"])  # sync, no partial rollout: nothing is stale


def test_a_key_near_none_lists_the_allowed_keys_only() -> None:
    with pytest.raises(GRPOConfigError) as raised:
        load_config(None, ["rollout.zzzz=1"])
    assert str(raised.value).startswith("unknown key 'rollout.zzzz'; allowed keys here: prompts_per_step")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(GRPOConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  n_samples: 4\n")
    with pytest.raises(GRPOConfigError, match=r"unknown key .rollout\.n_samples."):
        load_config(bad)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["parallel.train.tensor=2"], "parallel.train"),  # torch engine: data parallel only
        (["engine.train=megatron", "parallel.train.tensor=3"], "parallel.train.tensor"),  # 2 heads
        (["engine.train=megatron", "parallel.train.pipeline=4"], "parallel.train.pipeline"),  # 2 layers
        (
            ["engine.train=megatron", "parallel.train.pipeline=2", "parallel.train.virtual_pipeline=2"],
            "parallel.train.virtual_pipeline",
        ),
        (["engine.train=megatron", "parallel.train.expert=2"], "parallel.train.expert"),
        (["engine.train=megatron", "parallel.infer.tensor=2"], "parallel.infer.tensor"),
        (  # a tensor-parallel vLLM spans the whole actor group: no second replica
            [
                "engine.rollout=vllm",
                "engine.train=megatron",
                "parallel.train.tensor=2",
                "parallel.infer.tensor=2",
                "resources.num_actor_workers=2",
            ],
            "parallel.infer.tensor",
        ),
        (
            ["engine.train=megatron", "parallel.train.tensor=2", "resources.use_ray=false"],
            "resources.use_ray",
        ),
    ],
)
def test_impossible_layouts_are_refused_naming_the_key(overrides: list[str], key: str) -> None:
    import re

    from entrepot.grpo.errors import GRPOConfigError

    with pytest.raises(GRPOConfigError, match="^" + re.escape(key) + r" \("):
        load_config(None, overrides)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["resources.num_reference_workers=2"], "resources.num_reference_workers"),  # co-located role
        (["resources.num_reward_model_workers=1"], "resources.num_reward_model_workers"),
        (["resources.colocate=false", "resources.use_ray=false"], "resources.colocate"),
        (["resources.colocate=false", "engine.train=megatron"], "resources.colocate"),
        (["resources.colocate=false", "engine.offload_reference=true"], "engine.offload_reference"),
        (["resources.colocate=false", "engine.offload_reward_models=true"], "engine.offload_reward_models"),
        (["algorithm.kl_coef=0", "model.ref_model_load_path=/somewhere"], "model.ref_model_load_path"),
        (["reward.verifiers={}"], "reward.verifiers"),  # nothing scores
        (["reward.model_micro_batch=0"], "reward.model_micro_batch"),
        (["logging.metrics_file=../../x.jsonl"], "logging.metrics_file"),  # outputs stay in the run dir
        (["logging.metrics_file=/tmp/x.jsonl"], "logging.metrics_file"),
        (["logging.metrics_file=logs/../../x.jsonl"], "logging.metrics_file"),
        (["logging.metrics_file="], "logging.metrics_file"),
        (["resources.custom_resources_per_worker={NPU: 1.5}"], "resources.custom_resources_per_worker.NPU"),
        (["resources.custom_resources_per_worker={NPU: -1}"], "resources.custom_resources_per_worker.NPU"),
        (["resources.custom_resources_per_worker={GPU: 1}"], "resources.custom_resources_per_worker.GPU"),
        (['resources.custom_resources_per_worker={"": 1}'], "resources.custom_resources_per_worker"),
    ],
)
def test_deployments_that_cannot_hold_together_are_refused(overrides: list[str], key: str) -> None:
    import re

    with pytest.raises(GRPOConfigError, match="^" + re.escape(key) + r" \("):
        load_config(None, overrides)


def test_offload_of_co_located_models_follows_the_device_unless_set() -> None:
    cpu = load_config(None, [])
    assert not cpu.engine.reference_offloaded and not cpu.engine.reward_models_offloaded
    gpu = load_config(None, ["engine.device=cuda"])
    assert gpu.engine.reference_offloaded and gpu.engine.reward_models_offloaded
    mixed = load_config(None, ["engine.offload_reference=true", "engine.offload_reward_models=false"])
    assert mixed.engine.reference_offloaded and not mixed.engine.reward_models_offloaded


def test_check_machine_refuses_a_device_this_machine_lacks() -> None:
    from entrepot.grpo.run.preflight import check_machine

    check_machine(load_config(None, ["engine.train=megatron", "parallel.train.tensor=2"]))  # runs here
    if not torch.cuda.is_available():
        with pytest.raises(GRPOConfigError, match=r"engine\.device \('cuda'\) needs a CUDA GPU"):
            check_machine(load_config(None, ["engine.device=cuda"]))
    if importlib.util.find_spec("torch_npu") is None:
        with pytest.raises(GRPOConfigError, match=r"engine\.device \('npu'\) needs torch_npu"):
            check_machine(load_config(None, ["engine.device=npu"]))


def test_the_rendezvous_port_is_free_and_outside_the_ephemeral_range() -> None:
    """Outgoing connections draw local ports from the ephemeral range: a rendezvous port there can be
    taken between the driver's pick and rank 0's listen (EADDRINUSE)."""
    import socket

    from entrepot.grpo.engines.rendezvous import _ephemeral_start, free_local_port

    ports = {free_local_port() for _ in range(20)}
    assert all(20000 <= port < _ephemeral_start() for port in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: binds


@pytest.mark.parametrize(
    ("overrides", "run_name"),
    [
        ([], "grpo-reverse"),
        (["data.task=addition"], "grpo-addition"),
        (["model.path=models/smollm2/", "data.task=jsonl", "data.train_path=data/gsm8k-train.jsonl"],
         "grpo-smollm2-gsm8k-train"),  # a jsonl run on a local model is not named after the default task
        (["model.path=models/smollm2", "data.task=word_problems"], "grpo-smollm2-word_problems"),
        (["name=mine", "data.task=addition"], "mine"),  # a name given wins
    ],
)  # fmt: skip
def test_the_run_name_comes_from_the_model_and_the_data(overrides: list[str], run_name: str) -> None:
    assert load_config(None, overrides).run_name == run_name


def test_an_empty_or_nested_name_is_refused() -> None:
    for name in ("''", "a/b"):
        with pytest.raises(GRPOConfigError, match=r"^name \(.*\) must be a non-empty name without '/'"):
            load_config(None, [f"name={name}"])
