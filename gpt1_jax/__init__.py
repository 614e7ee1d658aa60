"""gpt1-jax: GPT-1 (Radford et al., 2018) in JAX/Flax, faithful to the release and built to scale out."""

import gc

# The imports below make ~120,000 long-lived objects (jax, flax, optax); the cyclic collector's passes over them
# while they are made, which find no garbage, cost every command 4-10% of its start-up (2026-12-02, `python -c
# "import gpt1_jax.cli"` alternating with and without this: 1.32 and 1.27 CPU-s on average over 8 runs, 1.72 and
# 1.55 over 12 later, the host slower).
_collecting = gc.isenabled()
gc.disable()
try:
    from gpt1_jax.topology import skip_absent_tpu

    skip_absent_tpu()  # before any backend starts: a CPU run never loads an installed libtpu (gpt1_jax/topology.py)

    from gpt1_jax.config import ConfigError, ModelConfig, model_preset
    from gpt1_jax.model import GPT1, init_params, lm_logits
    from gpt1_jax.tokenizer import GPT1Tokenizer
    from gpt1_jax.weights import load_pretrained, save_pretrained
finally:
    if _collecting:
        gc.enable()

__all__ = [
    "GPT1", "GPT1Tokenizer", "ConfigError", "ModelConfig", "init_params", "lm_logits", "load_pretrained",
    "model_preset", "save_pretrained",
]
