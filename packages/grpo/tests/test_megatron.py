"""megatron-core as the actor's training engine, on CPU with gloo (its supported CPU mode).

Parity with the HF module (same weights): log-probs at TP2, PP2, TP2 x PP2 and PP2 x VPP2 (fp32,
<= 1e-4) and the parameters after one clipped update (<= 1e-5; 1e-4 where fp32 summation order
meets Adam's first step, see test_megatron_matches_the_hf_module); then `engine.train=megatron`
end to end through Ray at TP2 and at PP2 x VPP2 (train -> TP1 rollout, resharded and checksummed
every step, every offload key on) and its exact resume.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from entrepot.grpo import load_config, train
from entrepot.grpo.engines.rendezvous import free_local_port
from entrepot.grpo.run.metrics import read_metrics

pytest.importorskip("megatron.core")

pytestmark = pytest.mark.integration  # spawned gloo worlds, training runs, Ray


VPP2 = ("model.num_layers=4", "parallel.train.virtual_pipeline=2")  # interleaved: 2 chunks per stage
QWEN2 = ("model.architecture=qwen2", "model.num_heads=4", "model.num_kv_heads=2",
         "model.intermediate_size=96")  # fmt: skip


TWO_RANKS = [["tp2", 2, 1, []], ["pp2", 1, 2, []], ["pp2xvpp2", 1, 2, list(VPP2)]]
"""The two-rank cases of test_megatron_matches_the_hf_module: (id, tp, pp, model overrides)."""


@pytest.fixture(scope="module")
def two_rank_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One spawned gloo world of 2 ranks that runs every two-rank comparison with the HF module, one
    after another (each at its own layout, megatron's parallel state rebuilt), then the loss family's:
    a world's start-up (importing megatron-core in each rank) is paid once, not four times. Each
    comparison writes into its own folder (`<id>/<rank>.json`), which its test reads.
    """
    import tests_support_megatron as support

    out = tmp_path_factory.mktemp("megatron-2-ranks")
    try:
        mp.spawn(support.compare_in_one_world, args=(2, free_local_port(), str(out), TWO_RANKS), nprocs=2)
    except Exception as error:  # a failed case: its test reports it (`<rank>.error`), the later ones this
        (out / "world.error").write_text(f"the two-rank world stopped: {error}")
    return out


def _results(folder: Path, world: int) -> list:  # type: ignore[type-arg]
    errors = [p.read_text() for p in sorted(folder.glob("*.error"))]
    assert not errors, errors[0]
    stopped = folder.parent / "world.error"
    assert all((folder / f"{r}.json").is_file() for r in range(world)), (
        stopped.read_text() if stopped.is_file() else f"no results in {folder}"
    )
    return [json.loads((folder / f"{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize(
    ("tp", "pp", "model", "param_tol"),
    [(2, 1, (), 1e-5), (1, 2, (), 1e-4), (2, 2, QWEN2, 1e-4), (1, 2, VPP2, 1e-4)],
    ids=["tp2", "pp2", "qwen2-tp2xpp2", "pp2xvpp2"],  # GPT-2 at TP2 x PP2: tp2 and pp2 cover its two axes
)
def test_megatron_matches_the_hf_module(
    tp: int, pp: int, model: tuple[str, ...], param_tol: float, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Same log-probs, gradient norm and updated parameters as the HF module.

    Qwen2's and GPT-2 PP2's parameter tolerances are looser: Adam's first step moves each element
    by about lr x g / |g|, so an element whose gradient is ~1e-10 (found in Qwen2's o_proj) turns
    fp32 summation-order noise into differences of a few 1e-5 (lr 1e-3; GPT-2 at PP2: 1.3e-5 on
    one element; at PP2 x VPP2 on an Intel Xeon host, whose kernels sum in another order than the
    AMD host's: 1.8e-5); their gradient norms still agree to 1e-5 (3.6e-7 there).

    The two-rank layouts run in one shared world (`two_rank_world`); Qwen2 at TP2 x PP2 in its own 4.
    """
    import tests_support_megatron as support

    world = tp * pp
    case = request.node.callspec.id
    if world == 2:
        assert [tp, pp, list(model)] == next(c[1:] for c in TWO_RANKS if c[0] == case)
        results = _results(request.getfixturevalue("two_rank_world") / case, world)
    else:
        args = (world, tp, pp, free_local_port(), str(tmp_path), model)
        mp.spawn(support.compare_with_hf, args=args, nprocs=world)
        results = _results(tmp_path, world)
    logp = [r["logp_diff"] for r in results if "logp_diff" in r]
    assert len(logp) == tp  # the last stage's TP ranks computed log-probs
    assert max(logp) <= 1e-4, logp
    assert max(r["grad_norm_diff"] for r in results) <= 1e-5, results
    assert max(r["param_diff"] for r in results) <= param_tol, results


TP2 = ["engine.train=megatron", "parallel.train.tensor=2", "logging.tensorboard=false", "eval.every=0",
       "eval.num_prompts=8", "rollout.prompts_per_step=4", "checkpoint.keep_last=0"]  # fmt: skip
"""Small steps (4 prompts x 8 samples): what the test checks is the sharded state, not how much it learns."""


OFFLOAD_ALL = ["engine.offload_params=true", "engine.offload_grads=true", "engine.offload_optimizer=true",
               "engine.offload_reference=true"]  # fmt: skip


@pytest.mark.parametrize(
    "layout",
    [("parallel.train.pipeline=2", *VPP2)],
    ids=["tp2xpp2xvpp2"],  # one 4-rank world: tensor- and pipeline-sharded state, interleaved schedule
)
def test_megatron_trains_and_resumes_bit_identically(  # type: ignore[no-untyped-def]
    ray_session, layout: tuple[str, ...], tmp_path: Path
) -> None:
    """Every offload key on: checkpoints read (and resume writes) state that sits in host memory."""
    overrides = [*TP2, *layout, *OFFLOAD_ALL, "max_steps=2", "checkpoint.save_every=1",
                 "algorithm.kl_coef=0.01"]  # fmt: skip
    config = load_config(None, overrides)
    full = tmp_path / "full"
    train(config, full)
    rows = read_metrics(full / "metrics.jsonl")
    assert all(r["reshard/seconds"] > 0 and r["reshard/bytes"] > 0 for r in rows)  # resharded every step
    assert all(r["memory/train_param_bytes_in_rollout"] == 0 for r in rows)  # offloaded while generating
    shards = sorted(p.name for p in (full / "checkpoints" / "step_000002").glob("model*.safetensors"))
    assert shards == [f"model.shard{rank:03d}.safetensors" for rank in range(4)]  # one per TP x PP rank
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000002")
    result = train(config, resumed, resume=True)
    assert result.steps == 2 and len(result.history) == 1
    for shard in shards:
        a = load_file(str(full / "checkpoints" / "step_000002" / shard))
        b = load_file(str(resumed / "checkpoints" / "step_000002" / shard))
        start = load_file(str(full / "checkpoints" / "step_000001" / shard))
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), shard
        assert any(not torch.equal(a[k], start[k]) for k in a)
    assert (full / "checkpoints" / "step_000002" / "hf" / "config.json").is_file()


def test_megatron_reference_from_its_own_path_is_kept_on_resume(tmp_path: Path) -> None:
    """`model.ref_model_load_path` converted to megatron's layout, offloaded between stages, resumed."""
    from tests_support_models import built_default_dir

    from entrepot.resharding.adaptors import get_adaptor

    ref_dir = built_default_dir(tmp_path / "ref", seed=123)
    hf = load_file(str(ref_dir / "model.safetensors"))
    from transformers import AutoConfig

    adaptor = get_adaptor("GPT2LMHeadModel", AutoConfig.from_pretrained(ref_dir))
    expected = adaptor.hf_to_train(hf)
    overrides = ["engine.train=megatron", "resources.use_ray=false", "logging.tensorboard=false",
                 "eval.every=0", "eval.num_prompts=16", "rollout.prompts_per_step=4",
                 "checkpoint.save_every=1", "checkpoint.keep_last=0", "engine.offload_reference=true",
                 f"model.ref_model_load_path={ref_dir}"]  # fmt: skip
    run = tmp_path / "run"
    train(load_config(None, [*overrides, "max_steps=1"]), run)
    train(load_config(None, [*overrides, "max_steps=2"]), run, resume=True)
    assert read_metrics(run / "metrics.jsonl")[0]["kl"] > 1e-3  # not the initial policy
    for step in ("step_000001", "step_000002"):
        saved = load_file(str(run / "checkpoints" / step / "reference.safetensors"))
        assert saved and saved.keys() <= expected.keys()
        assert all(torch.equal(saved[k], expected[k]) for k in saved), step


def test_megatron_computes_each_loss_as_the_torch_engine(two_rank_world: Path) -> None:
    """GSPO, CISPO, PPO-clip and Dr. GRPO with a masked row, PPO-clip and GSPO on multi-turn rows (the
    environment's tokens out of the loss): megatron at TP2 (padded grids) takes the
    torch engine's step (packed) to fp32 tolerance (gradient norm and loss 1e-5; parameters after
    Adam's first step 1e-4, as in test_megatron_matches_the_hf_module); the torch engine's own step is
    checked against the written-out formulas in test_loss_family.py. (Run in `two_rank_world`, after
    the two-rank comparisons with the HF module.)"""
    import tests_support_megatron as support

    for results in _results(two_rank_world / "losses", 2):
        assert len(results) == len(support.LOSS_CASES)
        for case, diffs in results.items():
            assert diffs["clip_frac"] > 0, case  # off-policy enough to clip
            assert diffs["param_diff"] <= 1e-4, (case, diffs)  # Adam's first step: see above
            assert diffs["grad_norm_diff"] <= 1e-5, (case, diffs)
            assert diffs["pg_loss_diff"] <= 1e-5, (case, diffs)


def test_megatron_trains_asynchronously_with_the_correction(tmp_path: Path) -> None:
    """trainer.mode async with the megatron engine in one process (here rather than in test_async.py:
    an in-process megatron run leaves process state behind that later in-process tests of other
    modules are not written for), IcePop correcting the loss."""
    from entrepot.grpo.trainer import Trainer

    config = load_config(None, [
        "trainer.mode=async", "trainer.chunk_tokens=2", "rollout.prompts_per_step=8",
        "rollout.n_samples_per_prompt=4", "eval.every=0", "eval.num_prompts=8", "checkpoint.save_every=0",
        "logging.tensorboard=false", "logging.samples_every=0", "engine.train=megatron", "max_steps=3",
        "algorithm.correction.kind=icepop",
    ])  # fmt: skip
    trainer = Trainer(config, tmp_path / "run")
    try:
        rows = trainer.fit()
    finally:
        trainer.close()
    ages = {k for r in rows for k, v in r.items() if k.startswith("async/tokens_age_") and v}
    assert [r["step"] for r in rows] == [1, 2, 3] and ages <= {"async/tokens_age_0", "async/tokens_age_1"}
    assert all(0.0 <= r["offpolicy/masked_frac"] <= 1.0 and r["offpolicy/is_weight_max"] > 0 for r in rows)
    # megatron's weights reached the rollout: every version up to its own was loaded or skipped for a
    # newer one (a count of loads alone depends on the timing, as in test_async)
    versions = [r["async/rollout_version"] for r in rows]
    assert versions == sorted(versions) and versions[-1] >= 1
    assert sum(r["async/weight_loads"] + r["async/weight_versions_skipped"] for r in rows) == versions[-1] + 1


def test_megatron_trains_multiturn_trajectories(tmp_path: Path) -> None:
    """The calculator's multi-turn rows through the megatron engine in one process (here for the
    reason given above): the environment's tokens ride along in the forward pass, out of the loss."""
    from tests_support_envs import CALCULATOR

    from entrepot.grpo.trainer import Trainer

    config = load_config(None, [
        *CALCULATOR, "engine.train=megatron", "rollout.prompts_per_step=8", "rollout.n_samples_per_prompt=4",
        "eval.every=0", "eval.num_prompts=8", "checkpoint.save_every=0", "logging.tensorboard=false",
        "max_steps=2", "algorithm.epochs=2",
    ])  # fmt: skip
    trainer = Trainer(config, tmp_path / "run")
    try:
        before = trainer.parameters()
        rows = trainer.fit()
        after = trainer.parameters()
    finally:
        trainer.close()
    assert [r["step"] for r in rows] == [1, 2] and any(not torch.equal(before[k], after[k]) for k in before)
    assert any(r["multiturn/env_token_frac"] > 0 for r in rows)


def test_smollm2_trains_two_steps_with_megatron(smollm2: Path, tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct (Llama: 30 layers, 9 query / 3 KV heads, RoPE theta 1e5, tied embeddings)
    as a megatron-core GPTModel (TP1, one process): two steps, resharded into the rollout each step,
    and the checkpoint's HF export loads in transformers with every weight's name and shape, trained."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    prompts = tmp_path / "train.jsonl"
    rows = [{"prompt": f"What is {a} + {a}? Answer after ####.", "answer": str(2 * a)} for a in (1, 2, 3, 4)]
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = [f"model.path={smollm2}", "data.task=jsonl", f"data.train_path={prompts}",
                 f"data.eval_path={prompts}", "engine.train=megatron", "resources.use_ray=false",
                 "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=4", "rollout.max_new_tokens=16",
                 # rewards that vary within each group (even answers): the update has a gradient
                 "reward.custom={length: 'tests_support_rewards:varied_if_answer_even'}",
                 "reward.verifiers={length: 1.0}", "algorithm.lr=1e-5", "algorithm.kl_coef=0.01",
                 "eval.every=0", "eval.num_prompts=4", "checkpoint.save_every=2", "checkpoint.keep_last=1",
                 "logging.tensorboard=false", "logging.samples_every=0", "max_steps=2"]  # fmt: skip
    result = train(load_config(None, overrides), tmp_path / "run")
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [1, 2]
    assert all(r["reshard/bytes"] > 0 and r["grad_norm"] > 0 for r in metrics), metrics
    assert result.checkpoint is not None
    export = AutoModelForCausalLM.from_pretrained(result.checkpoint / "hf", dtype=torch.float32)
    trained = dict(export.named_parameters())
    with safe_open(str(smollm2 / "model.safetensors"), framework="pt") as start:
        names = list(start.keys())
        assert {n for n in names if n != "lm_head.weight"} <= trained.keys()
        assert all(list(trained[n].shape) == start.get_slice(n).get_shape() for n in names if n in trained)
        assert any(not torch.equal(trained[n], start.get_tensor(n)) for n in names if n in trained)
