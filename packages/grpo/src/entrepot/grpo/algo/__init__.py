"""GRPO maths: losses, advantages, sequences, micro-batched passes, optimiser. Tensors in, tensors out."""
