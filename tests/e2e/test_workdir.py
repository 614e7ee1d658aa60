"""A run folder belongs to one job (gpt1_jax/workdir.py), a run's config.yaml is guarded by a digest
(gpt1_jax/config.py), and a trained BPE is kept only while it fits its corpus (gpt1_jax/data/tokens.py):
in-process, no training. The command-line cases are in test_pretrain.py and test_finetune.py."""

import pytest

from gpt1_jax import workdir as wd
from gpt1_jax.errors import WorkdirError
from tests.support.workdir import PRETRAIN


def test_a_read_only_disk_is_refused_before_anything_runs(tmp_path, mount_tmpfs):
    import subprocess

    disk = mount_tmpfs(tmp_path / "disk", 1 << 20)
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    with pytest.raises(WorkdirError, match=f"cannot write --workdir {disk}/run: {disk} is on a read-only file system"):
        wd.check(disk / "run", PRETRAIN, "pretrain")
