"""gpt1-jax: GPT-1 (Radford et al., 2018) in JAX/Flax, faithful to the release and built to scale out."""

from gpt1_jax.topology import skip_absent_tpu

skip_absent_tpu()  # before any backend starts: a CPU run never loads an installed libtpu (gpt1_jax/topology.py)

from gpt1_jax.config import ConfigError, ModelConfig, model_preset  # noqa: E402
from gpt1_jax.model import GPT1, init_params, lm_logits  # noqa: E402
from gpt1_jax.tokenizer import GPT1Tokenizer  # noqa: E402
from gpt1_jax.weights import load_pretrained, save_pretrained  # noqa: E402

__all__ = [
    "GPT1", "GPT1Tokenizer", "ConfigError", "ModelConfig", "init_params", "lm_logits", "load_pretrained",
    "model_preset", "save_pretrained",
]
