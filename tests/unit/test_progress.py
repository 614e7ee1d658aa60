"""The training bar (gpt1_jax/metrics.py Progress) on a clock the test moves: work between steps (a compilation, an
evaluation) is said on the bar and left out of its rate, ETA and elapsed time. How the loop uses it:
tests/unit/test_checkpoint.py."""

import re

from gpt1_jax.metrics import Progress


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _bar_on(clock: Clock, total: int, **options) -> Progress:
    progress = Progress(total, 0, desc="train", **options)
    progress.bar._time = clock  # tqdm's own clock, which its start and print times were read from
    progress.bar.start_t = progress.bar.last_print_t = clock()
    return progress


def _frames(err: str) -> list[str]:
    return [line.strip() for line in err.replace("\r", "\n").splitlines() if line.strip()]


def test_a_first_compilation_is_said_and_left_out_of_the_eta(capsys):
    """Step 1's compilation (6-26 s) sat at 0/N without a word, then tqdm extrapolated from it: "ETA 06:14" for a
    35 s run. Here it takes 20 s, then each step 1 s: the ETA is the steps' own."""
    clock = Clock()
    progress = _bar_on(clock, 10)
    with progress.paused("compiling"):
        assert str(progress.bar).endswith(", compiling]")
        clock.now += 20
    for _ in range(4):
        clock.now += 1
        progress.update(1, loss=2.5)
    shown = str(progress.bar)
    assert "4/10 [00:04<00:06, " in shown and shown.endswith(", loss=2.5]"), shown  # its fields are back
    assert any(frame.endswith("0/10 [00:00<?, ?step/s, compiling]") for frame in _frames(capsys.readouterr().err))
    progress.close()


def test_an_evaluation_is_said_and_left_out_of_the_closing_rate(capsys):
    """The bar sat frozen through each evaluation (RACE's dev set: 19 s), and its closing rate counted them: 10.87
    s/step shown against a real 7.79. Five steps of 1 s, a 100 s evaluation that writes its line at its end (the
    bar is drawn again under it), five more: 1 step/s throughout, and at the end."""
    clock = Clock()
    progress = _bar_on(clock, 10)
    for step in range(1, 11):
        clock.now += 1
        progress.update(1, loss=2.5)
        if step == 5:
            with progress.paused("evaluating dev"):
                clock.now += 100
                progress.write("epoch 1 (step 5): train_loss 2.5000")
    progress.close()
    frames = _frames(capsys.readouterr().err)
    evaluating = [i for i, frame in enumerate(frames) if "evaluating dev" in frame]
    assert len(evaluating) == 2 and frames[evaluating[1] - 1] == "epoch 1 (step 5): train_loss 2.5000", frames
    assert all(re.search(r" 5/10 \[00:05<00:05, +1\.00step/s, evaluating dev\]$", frames[i]) for i in evaluating)
    assert re.fullmatch(r"train: 100%\|█+\| 10/10 \[00:10<00:00, +1\.00step/s, loss=2\.5\]", frames[-1]), frames[-1]


def test_without_a_bar_a_pause_says_nothing(capsys):
    """--no-progress: no bar and no status line, and what the pause runs still runs."""
    progress = Progress(10, 0, enabled=False, speaks=True)
    ran = []
    with progress.paused("compiling"):
        ran.append(1)
    progress.update(1, loss=2.5)
    progress.close()
    assert ran == [1] and capsys.readouterr().err == ""


def test_a_log_file_gets_a_frame_every_ten_seconds_and_a_terminal_two_a_second(tmp_path):
    """A scheduler's log (or the launcher's prefixed lines) kept every frame, two a second: ~20 MB a day of a long
    run. A real terminal (a pty) still redraws twice a second."""
    import os

    from gpt1_jax.metrics import redraw_interval

    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as terminal, open(tmp_path / "log", "w") as log:
        assert (redraw_interval(terminal), redraw_interval(log)) == (0.5, 10.0)
    os.close(leader)
    assert redraw_interval(terminal) == 10.0  # a closed stream
