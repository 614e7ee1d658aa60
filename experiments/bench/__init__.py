"""Benchmarks: gpt1-jax vs Hugging Face transformers, step breakdowns and checkpoint integrity costs."""
