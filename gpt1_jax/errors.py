"""The project's own error classes: the ones `gpt1-jax` turns into one line and exit status 2.

Anything else that escapes a verb is a bug and keeps its traceback. Each class also derives from the
built-in it refines (ValueError, OSError, FloatingPointError), so library callers can catch either.
"""

from __future__ import annotations


class GPT1JaxError(Exception):
    """Base of every error whose message is one line meant for the user."""


class ConfigError(GPT1JaxError, ValueError):
    """A config value, flag or override that cannot work."""


class DataError(GPT1JaxError, ValueError):
    """Input data that cannot be read as claimed: corpus files, GLUE/RACE files, token ids."""


class CheckpointFormatError(GPT1JaxError, ValueError):
    """A checkpoint or weights folder that cannot be read as claimed (missing, truncated, corrupt)."""


class CheckpointWriteError(GPT1JaxError, OSError):
    """A checkpoint that could not be written (full disk, unwritable folder); the earlier ones are untouched."""


class CheckpointMismatchError(GPT1JaxError, ValueError):
    """A workdir holding a checkpoint of another model than the one asked for."""


class DivergenceError(GPT1JaxError, FloatingPointError):
    """The training loss became NaN or infinite. The run stops (exit 1) keeping its last good checkpoint."""

    def __init__(self, message: str, step: int, loss: float, last_good: int | None = None):
        super().__init__(message)
        self.step, self.loss, self.last_good = step, loss, last_good


class WorkdirError(GPT1JaxError, ValueError):
    """A run folder this job must not write into: another job's run, its own init source, a file, a stranger's
    folder, one it cannot write (gpt1_jax/workdir.py)."""


class OutputExistsError(GPT1JaxError, FileExistsError):
    """An output folder that is not empty, which a command replaces only when told to (`convert --overwrite`)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during training, raised once the loop has closed (gpt1_jax/loop.py); `step`: the checkpoint a
    rerun resumes from (None: none). `gpt1-jax` prints its message as one line and exits 130. A
    KeyboardInterrupt, not a GPT1JaxError: an
    `except Exception` on the way up must not turn a Ctrl-C into an error to log and go on from."""

    def __init__(self, message: str, step: int | None = None, together: bool = False):
        super().__init__(message)
        self.step = step
        self.together = together  # multi-process: every process stopped at this step (the exit waits for them)


class PlanDoesNotFit(GPT1JaxError):
    """A pod plan whose compiled step needs more memory per chip than the chip has (gpt1_jax/plan.py)."""


class DistributedConfigError(ConfigError):
    """Inconsistent multi-process flags or environment."""
