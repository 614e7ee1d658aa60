"""gpt1_jax/bench.py's timing loop, without a model: what it reports beside the step times."""

import mmap
from types import SimpleNamespace

from gpt1_jax.bench import timed_steps

PAGES = 16384  # 64 MB of 4 KB pages (or 32 huge ones where the kernel gives those)


class _Bar:
    def update(self, n):
        pass


def _step(fresh: bool):
    def compiled(state, batch, hyper):
        if fresh:  # a step that maps memory it has not touched before, as a growing heap does
            with mmap.mmap(-1, PAGES * 4096) as block:
                block[::4096] = b"x" * PAGES
        return state, {"loss": 1.0}
    return compiled


def test_the_timed_steps_page_faults_and_kernel_cpu_are_reported_and_a_fresh_mapping_shows():
    trainer = SimpleNamespace(hyper=None)
    _, losses, quiet = timed_steps(_step(False), trainer, None, [None] * 5, 2, _Bar())
    _, _, fresh = timed_steps(_step(True), trainer, None, [None] * 5, 2, _Bar())
    assert losses == [1.0] * 3
    assert set(quiet) == set(fresh) == {"minor_faults_per_step", "sys_cpu_s_per_step"}
    assert fresh["minor_faults_per_step"] >= 16 > quiet["minor_faults_per_step"]
    assert fresh["sys_cpu_s_per_step"] >= 0 and quiet["sys_cpu_s_per_step"] >= 0
