"""TensorBoard's writer (gpt1_jax/tracker.py) when the disk under it fills (tests/e2e/test_tracker.py: the trackers
in whole runs)."""

import errno
import threading
import time

from gpt1_jax.tracker import TensorBoard


def test_a_writer_thread_killed_by_a_full_disk_is_one_os_error_not_a_hang(tmp_path, capsys):
    """tensorboardX writes from a thread of its own: a full disk killed it with a traceback between the run's lines,
    and every later add_scalar waited forever on its full queue (the run hung; SIGTERM and Ctrl-C did not end it)."""
    board = TensorBoard(tmp_path, 0)

    def disk_full(event):
        raise OSError(errno.ENOSPC, "No space left on device")

    board._events._ev_writer.write_event = disk_full
    seen = {}

    def run():
        try:
            for step in range(1, 60):
                board.log(step, {"loss": 1.0, "lr": 0.1})
                time.sleep(0.01)  # a step's time
        except OSError as e:
            seen["error"] = e
        board.close()
        seen["closed"] = True

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(30)
    assert seen.get("closed"), "the run waited on a writer thread that had died"
    error = seen["error"]
    assert error.errno == errno.ENOSPC and error.filename == str(tmp_path / "tensorboard")
    assert "Traceback" not in capsys.readouterr().err
