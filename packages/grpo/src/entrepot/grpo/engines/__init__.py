"""Train engines (torch, megatron-core), rollout engines (embedded, HF, vLLM), reward models."""
