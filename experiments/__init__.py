"""Experiments run with gpt1_jax, each a module run from the repository root: `python -m experiments.paper.run ...`."""
