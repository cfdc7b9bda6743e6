"""A run's lifecycle around the step: checkpoints, metrics, evaluation, memory estimate,
preflight, Ray start."""
