"""The names config.py validates against agree with the registries beside their code. config.py is imported
by the modules holding those registries, so it keeps the names itself; these tests keep the two as one."""

from gpt1_jax import config
from gpt1_jax.data.glue import GLUE_TASKS
from gpt1_jax.optim import OPTIMIZERS, SCHEDULES
from gpt1_jax.sharding import DEFAULT_RULES


def test_optimizer_and_schedule_names_are_the_registries():
    assert config.OPTIMIZER_NAMES == tuple(OPTIMIZERS)
    assert config.SCHEDULE_NAMES == tuple(SCHEDULES)


def test_logical_axes_are_the_rules_table():
    assert config.LOGICAL_AXES == tuple(name for name, _ in DEFAULT_RULES)


def test_task_names_are_glue_then_race():
    assert config.TASK_NAMES == (*GLUE_TASKS, "race")
