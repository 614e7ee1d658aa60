"""--profile START:STOP (config `profile`): a jax.profiler trace of those steps into <workdir>/profile/, in the
formats TensorBoard's profile plugin / XProf (.xplane.pb) and Perfetto (perfetto_trace.json.gz) read; the traced
steps are left out of tokens/s; the trace observes the run and never changes it (a profiled run:
tests/e2e/test_observe.py); a bad window is one line."""

import dataclasses

import pytest

from gpt1_jax.config import FinetuneConfig, PretrainConfig, preset
from gpt1_jax.errors import ConfigError


@pytest.mark.parametrize("window, message", [
    ("3", "profile '3': expected START:STOP, two step numbers"),
    ("a:b", "profile 'a:b': expected START:STOP"),
    ("4:2", "profile '4:2': expected 1 <= START <= STOP"),
    ("0:2", "profile '0:2': expected 1 <= START <= STOP"),
])
def test_a_bad_window_is_one_line(window, message):
    for cls in (PretrainConfig, FinetuneConfig):
        with pytest.raises(ConfigError, match=message):
            dataclasses.replace(preset(cls, "tiny"), profile=window)


def test_a_window_past_the_last_step_is_refused():
    with pytest.raises(ConfigError, match="profile 40:60 ends after the run's last step \\(50\\)"):
        dataclasses.replace(preset(PretrainConfig, "tiny"), profile="40:60")
