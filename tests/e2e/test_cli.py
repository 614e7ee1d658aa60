"""The one command line: every verb that runs a model takes the shared flags; a flag that sets config fields
is declared once and says which in --help; --seed means one thing everywhere; evaluate and sample read the
same model sources; a project error ends as one line (exit 2, or 1 for a diverged run), anything else keeps
its traceback. One model runs: evaluate on the committed 5M release, seconds."""


import pytest

from gpt1_jax import cli
from tests.support.cli import _one_error_line


@pytest.mark.parametrize("where", ["workdir", "cache_dir"])
def test_a_read_only_disk_is_one_line(tmp_path, capsys, monkeypatch, mount_tmpfs, vocab_dir, where):
    """A real read-only file system (a tmpfs remounted ro; needs root). The token cache has no up-front check:
    its OSError reaches the command line's own catch."""
    import subprocess

    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    disk = mount_tmpfs(tmp_path / "disk", 1 << 20)
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    workdir = disk / "run" if where == "workdir" else tmp_path / "run"
    cache = disk / "cache" if where == "cache_dir" else tmp_path / "cache"
    status = cli.main(["pretrain", "--config", "tiny", "--data", "default", "--workdir", str(workdir),
                       "--set", f"data.cache_dir={cache}", "--set", f"data.tokenizer={vocab_dir}"])
    line = _one_error_line(capsys, "pretrain")
    assert status == 2 and str(disk) in line and "read-only" in line.lower(), line
    assert not (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "run" / "checkpoints").exists()
