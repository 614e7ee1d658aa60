"""gpt1_jax/files.py: a file is replaced whole or not at all, text and plots alike."""

import matplotlib
import pytest

from gpt1_jax.files import atomic_write, atomic_write_text, save_figure

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
