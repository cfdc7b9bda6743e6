"""A run's lifecycle around the step: checkpoints, the run's identity and resume checks, metrics,
memory estimate, preflight, Ray start and its session record."""
