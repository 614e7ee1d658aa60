"""What tests/unit/test_workdir.py and tests/e2e/test_workdir.py share."""

from gpt1_jax import workdir as wd


PRETRAIN = wd.Identity("pretrain")
