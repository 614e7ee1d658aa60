"""gpt1_jax/files.py: a file, or a folder, is replaced whole or not at all, text and plots alike."""

import os

import matplotlib
import pytest

from gpt1_jax.files import atomic_write, atomic_write_text, save_figure, staging_folder
from tests.support.killed import gone_pid

matplotlib.use("Agg")


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "results.json"
    atomic_write_text(path, "old")

    def half_then_fail(tmp):
        tmp.write_text("ha")
        raise KeyboardInterrupt  # Ctrl-C half-way

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_a_figure_is_saved_in_the_format_its_name_says(tmp_path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save_figure(fig, tmp_path / "curve.png")
    save_figure(fig, tmp_path / "curve.svg")
    plt.close(fig)
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "curve.svg").read_bytes()[:400]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.png", "curve.svg"]


def test_a_staging_folder_is_renamed_whole_or_removed_and_sweeps_what_killed_writers_left(tmp_path):
    final = tmp_path / "cache" / "tokens-abc"
    gone = gone_pid()
    with staging_folder(final) as tmp:  # the parent is made
        assert tmp.parent == final.parent and tmp.name.startswith(f".tmp-{final.name}-{os.getpid()}-")
        (tmp / "half").write_text("x")
        with pytest.raises(KeyboardInterrupt), staging_folder(final):
            raise KeyboardInterrupt  # Ctrl-C half-way through another writer's folder
        assert sorted(p.name for p in final.parent.iterdir()) == [tmp.name]  # the other one's gone, ours kept
    assert list(final.parent.iterdir()) == []  # not renamed onto `final`: removed on the way out
    killed = final.parent / f".tmp-{final.name}-{gone}-0123abcd"  # what a killed writer on this host left
    killed.mkdir()
    live = final.parent / f".tmp-{final.name}-{os.getpid()}-0123abcd"  # a live writer's (this process)
    live.mkdir()
    other = final.parent / f".tmp-other-{gone}-0123abcd"  # another folder's
    other.mkdir()
    with staging_folder(final, dead_quiet_s=60.0) as tmp:  # the killed writer's files are not quiet long enough
        assert killed.exists()
    with staging_folder(final) as tmp:
        (tmp / "whole").write_text("x")
        os.rename(tmp, final)
    assert sorted(p.name for p in final.parent.iterdir()) == sorted([final.name, live.name, other.name])
    assert [p.name for p in final.iterdir()] == ["whole"]
