"""Checks of a config against this machine and its files, before any worker starts.

`GRPOConfig` validation is pure (the same answer on every machine); whether the configured device
exists, an engine's extra is installed, the model directory loads and the prompt files parse
depends on where the run starts. `train` and `rl grpo config validate` call these, so a config
that cannot start is refused with the key and the reason rather than failing inside a worker.
`check_inputs` also runs the data wing's pure checks of the sequence lengths (a synthetic prompt plus
its response against the built decoder's positions and the micro-batch token budgets), which the
config cannot run itself.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from entrepot.grpo import _install
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data.checks import check_task_fits
from entrepot.grpo.data.lengths import longest_sequence
from entrepot.grpo.engines.registry import choose_engines
from entrepot.grpo.errors import DataError, GRPOConfigError
from entrepot.grpo.run.deployment import joins_a_cluster, uses_ray
from entrepot.grpo.run.metrics import check_wandb

__all__ = ["check_inputs", "check_machine"]


def check_machine(config: GRPOConfig) -> None:
    """Raise `GRPOConfigError` (naming the key) if this machine cannot run `config`."""
    _check_device(config)
    _check_cpus(config)
    if config.logging.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise GRPOConfigError(
            "logging.tensorboard (true) needs tensorboard, which is not installed: "
            f"{_install.install_command('tensorboard')} (or logging.tensorboard=null to write it only when "
            "installed)"
        )
    check_wandb(config.logging)
    if config.model.lora.enabled and not _installed("peft"):
        raise GRPOConfigError(
            f"model.lora.rank ({config.model.lora.rank}) needs peft, which is not installed: "
            f"{_install.LORA}, or model.lora.rank=0 to train every weight"
        )
    engines = choose_engines(config.engine)
    if engines.train.module is not None and not _installed(engines.train.module):
        raise GRPOConfigError(
            f"engine.train ({engines.train.name!r}) needs megatron-core, which is not installed: "
            f"{_install.install_command(engines.train.module)}"
        )
    if engines.rollout.module is not None and not _installed(engines.rollout.module):
        raise GRPOConfigError(
            f"engine.rollout ({engines.rollout.name!r}) needs vLLM, which is not installed. "
            f"{_install.install_command(engines.rollout.module)}"
        )


def _installed(module: str) -> bool:
    """Whether `module` can be imported (a missing parent package counts as missing, not an error)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # find_spec("megatron.core") imports `megatron` first
        return False


def _check_device(config: GRPOConfig) -> None:
    kind = config.engine.device.split(":")[0]
    ranks = config.resources.num_actor_workers * config.parallel.train.model_parallel
    # on a cluster the workers' nodes hold the GPUs
    if kind == "cuda" and not joins_a_cluster(config.resources):
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found == 0:
            raise GRPOConfigError(
                f"engine.device ({config.engine.device!r}) needs a CUDA GPU; torch {torch.__version__} "
                "sees none on this machine (use engine.device=cpu, or a CUDA build of torch on a GPU host)"
            )
        if ranks > found:
            raise GRPOConfigError(
                f"engine.device ({config.engine.device!r}): the actor group has {ranks} ranks "
                f"(DP x TP x PP), one GPU each, and this machine has {found}"
            )
    elif kind == "npu" and importlib.util.find_spec("torch_npu") is None:
        raise GRPOConfigError(
            f"engine.device ({config.engine.device!r}) needs torch_npu (Ascend), which is not installed"
        )


def _check_cpus(config: GRPOConfig) -> None:
    """A local Ray cluster has this machine's CPUs: every worker's reserved share must fit in them."""
    resources = config.resources
    if not uses_ray(resources, config.parallel, config.dock) or joins_a_cluster(resources):
        return
    actor_ranks = resources.num_actor_workers * config.parallel.train.model_parallel
    workers = actor_ranks + resources.num_reward_workers
    if not resources.colocate:
        workers += resources.reference_workers if config.algorithm.kl_coef > 0 else 0
        workers += resources.reward_model_workers if config.reward.models else 0
    needed, have = workers * resources.num_cpus_per_worker, len(os.sched_getaffinity(0))
    if needed > have:
        raise GRPOConfigError(
            f"resources.num_cpus_per_worker ({resources.num_cpus_per_worker:g}): {workers} workers reserve "
            f"{needed:g} CPUs and this machine has {have} (fractional shares co-locate, e.g. 0.01)"
        )


def check_inputs(config: GRPOConfig, *, every_prompt: bool = False) -> None:
    """Raise `DataError` / `GRPOConfigError` / `RewardError` if the sequence lengths, the verifiers, the
    model directory or the prompt files cannot be used.

    Checks the longest prompt + response against the built decoder's positions and the token
    budgets (`entrepot.grpo.data.checks.check_task_fits`), imports the custom verifiers and checks
    every verifier name (`registry_names.check_reward_names`), loads the
    model directory's config and tokenizer (not its weights), refuses one whose config declares a
    quantization (`engines.model_import.check_not_quantized`), checks its shape against the parallel
    layout, the longest sequence and the tokenizer (and, with engine.train=megatron, that megatron's
    recipe builds its architecture and RoPE), checks the reference directory, the distillation
    teacher (`run.teacher.check_teacher`) and the reward-model directories (configs and
    tokenizers), reads the prompt files and reads every gold answer the way the math verifiers will
    (`rewards.check_gold_answers`). A multi-turn run imports its environment and, with a local model,
    checks that its chat template is append-only (`multiturn.template_check`). With `every_prompt`
    (`train` and ``rl grpo config validate``) every prompt is also encoded under the chat template,
    in batches, so one too long for ``data.max_prompt_tokens`` is found before a run, not at the step
    that draws it.
    """
    from entrepot.grpo.data import rewards
    from entrepot.grpo.run.registry_names import check_reward_names

    check_task_fits(config)
    rewards.resolve_custom(config.reward.custom)  # user verifiers import here, as in the reward workers
    check_reward_names(config.reward, config.audit.format_check)
    if config.reward.code.require_isolation and "code_tests" in config.reward.verifiers:
        from entrepot.grpo.sandbox import isolation

        isolation().require()  # SandboxError naming the failed step, before anything starts
    tokenizer, hf_config = None, None
    if config.model.path is not None:
        from entrepot.grpo.engines.model_import import check_not_quantized
        from entrepot.grpo.engines.models import load_model_config, load_tokenizer

        hf_config = load_model_config(config.model.path)
        check_not_quantized(config.model.path)
        _check_model_shape(config, hf_config)
        _check_megatron_recipe(config, hf_config)
        tokenizer = load_tokenizer(config.model.path)
        vocab = getattr(hf_config, "vocab_size", None)
        if vocab is not None and len(tokenizer) > vocab:
            raise DataError(
                f"model.path ({config.model.path!r}): its tokenizer has {len(tokenizer)} tokens and the "
                f"model's embedding only {vocab} (a tokenizer from another model?)"
            )
        if config.multiturn.enabled:  # trajectories append tokens: the template must render that way
            from entrepot.grpo.errors import TemplateError
            from entrepot.grpo.multiturn.template_check import require_append_only

            try:
                require_append_only(tokenizer)
            except TemplateError as exc:
                where = f"model.path ({config.model.path!r}) with multiturn.environment set"
                raise TemplateError(f"{where}: {exc} (rl grpo check-template shows the check)") from None
    _check_reference(config, hf_config)
    _check_teacher(config, hf_config)
    if config.multiturn.environment is not None:  # it imports, and its stop texts are single tokens
        from entrepot.grpo.data.sources import build_task
        from entrepot.grpo.multiturn import load_environment, stop_token_ids

        task_tokenizer = tokenizer if tokenizer is not None else build_task(config).tokenizer
        stop_token_ids(load_environment(config.multiturn.environment), task_tokenizer)
    if config.multiturn.agent is not None:  # it imports, and is an async function
        from entrepot.grpo.agents import check_server_installed, load_agent

        check_server_installed()
        load_agent(config.multiturn.agent)
    if config.reward.models:
        from entrepot.grpo.engines.reward_model import check_reward_model_dir

        for path in config.reward.models:
            check_reward_model_dir(path)
    if config.reward.judge.model_path is not None:
        from entrepot.grpo.engines.judge import check_judge_dir

        check_judge_dir(config.reward.judge.model_path)
    from entrepot.grpo.data.prompt_lengths import check_prompt_lengths
    from entrepot.grpo.data.sources import FileDataset, build_task
    from entrepot.grpo.data.tasks import HELD_OUT_POOL

    if config.data.task == "word_problems":  # the held-out pool's prompts fit data.max_prompt_tokens
        problems = build_task(config, tokenizer)
        prompts = [s.prompt for s in problems.source.held_out(HELD_OUT_POOL if every_prompt else 64)]
        check_prompt_lengths(problems, prompts, config.data.max_prompt_tokens)
    if config.data.task not in ("jsonl", "parquet", "code_functions"):
        return

    setup = build_task(config, tokenizer)  # reads and checks both prompt files (or makes the problems)
    assert isinstance(setup.source, FileDataset)  # data.task is jsonl, parquet or code_functions
    # every gold answer is readable by every math verifier (a RewardError naming the row otherwise)
    verifiers = [*config.reward.verifiers, config.reward.accuracy_verifier]
    rewards.check_gold_answers(verifiers, [s.answer for s in setup.source.samples()])
    if every_prompt:  # encoded in batches (entrepot.grpo.data.prompt_lengths)
        prompts = [s.prompt for s in setup.source.samples()]
        check_prompt_lengths(setup, prompts, config.data.max_prompt_tokens)


_SHAPE_KEYS = ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads")


def _check_reference(config: GRPOConfig, policy: Any) -> None:
    """`model.ref_model_load_path` loads, has the policy's vocabulary and (megatron) the policy's shape.

    `policy` is model.path's HF config (None: the built decoder's, made here).
    """
    path = config.model.ref_model_load_path
    if path is None:
        return
    from entrepot.grpo.data.sources import build_task
    from entrepot.grpo.engines.model_import import check_not_quantized
    from entrepot.grpo.engines.models import load_model_config, model_config

    reference = load_model_config(path, key="model.ref_model_load_path")
    check_not_quantized(path, key="model.ref_model_load_path")
    if policy is None:
        tok = build_task(config).tokenizer
        policy = model_config(config.model, tok.vocab_size, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id)  # fmt: skip
    sharded = choose_engines(config.engine).train.shards_weights  # megatron builds chunks of the same shape
    keys = ("vocab_size", *_SHAPE_KEYS) if sharded else ("vocab_size",)
    for key in keys:
        ours, theirs = getattr(policy, key, None), getattr(reference, key, None)
        if ours != theirs:
            why = "same token ids" if key == "vocab_size" else "the same megatron chunks"
            raise DataError(
                f"model.ref_model_load_path ({path!r}) has {key}={theirs!r}, the policy {ours!r}: the "
                f"reference must match the policy ({why})"
            )


def _check_teacher(config: GRPOConfig, policy: Any) -> None:
    """`algorithm.distill.teacher` exists (a checkpoint: verified) and has the policy's vocabulary size.

    `policy` is model.path's HF config (None: the built decoder, whose vocabulary is the task's).
    """
    path = config.algorithm.distill.teacher
    if path is None:
        return
    from entrepot.grpo.data.sources import build_task
    from entrepot.grpo.run.teacher import check_teacher

    built = policy is None  # the built decoder's vocabulary is its task tokenizer's
    vocab = build_task(config).tokenizer.vocab_size if built else getattr(policy, "vocab_size", None)
    check_teacher(path, vocab)


def _check_model_shape(config: GRPOConfig, hf_config: Any) -> None:
    """A local model's heads, layers and positions against the parallel layout and the longest sequence."""
    path, train = config.model.path, config.parallel.train
    heads: int | None = getattr(hf_config, "num_attention_heads", None)
    kv_heads: int = getattr(hf_config, "num_key_value_heads", None) or heads or 1
    if heads is not None and (heads % train.tensor or kv_heads % train.tensor):
        raise GRPOConfigError(
            f"parallel.train.tensor ({train.tensor}) must divide the attention heads ({heads}) and "
            f"key/value heads ({kv_heads}) of model.path ({path!r})"
        )
    layers = getattr(hf_config, "num_hidden_layers", None)
    stages = train.pipeline * (train.virtual_pipeline or 1)
    if layers is not None and layers % stages:
        raise GRPOConfigError(
            f"parallel.train.pipeline x virtual_pipeline ({stages}) must divide the {layers} layers of "
            f"model.path ({path!r})"
        )
    positions = getattr(hf_config, "max_position_embeddings", None)
    longest = longest_sequence(config.data, config.rollout, config.multiturn)
    if positions is not None and positions < longest:
        raise DataError(
            f"model.path ({path!r}) holds {positions} positions, fewer than the longest prompt + response "
            f"this config allows ({longest}); lower data.max_prompt_tokens or "
            + ("multiturn.max_tokens" if config.multiturn.enabled else "rollout.max_new_tokens")
        )


def _check_megatron_recipe(config: GRPOConfig, hf_config: Any) -> None:
    """engine.train=megatron: the megatron-core recipe builds model.path's architecture, layers and RoPE."""
    if not choose_engines(config.engine).train.shards_weights:
        return
    from entrepot.resharding import UnknownArchitectureError, UnsupportedModelError
    from entrepot.resharding.engines.megatron_support import check_megatron_support

    try:
        check_megatron_support(hf_config)
    except (UnknownArchitectureError, UnsupportedModelError) as exc:
        raise GRPOConfigError(
            f"model.path ({config.model.path!r}) with engine.train=megatron: its config.json's {exc} "
            "(engine.train=torch trains what transformers loads)"
        ) from None
