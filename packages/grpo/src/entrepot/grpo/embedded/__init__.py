"""What makes the CPU default fast: GPT-2 model and forward, prefix sharing, lanes, threads.

GPU users can skip this wing: nothing here is needed by a run on an accelerator."""
