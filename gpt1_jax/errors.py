"""The project's own error classes: the ones `gpt1-jax` turns into one line and exit status 2; and that line's
words for an OSError (`os_error_message`), which every command line of the project shares.

Anything else that escapes a verb is a bug and keeps its traceback. Each class also derives from the
built-in it refines (ValueError, OSError, FloatingPointError), so library callers can catch either.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

DEBUG_ENV = "GPT1_JAX_DEBUG"  # set: an error keeps its traceback (for a bug report), in every command line


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


def os_error_message(e: OSError, last_checkpoint: int | None = None) -> str:
    """`cannot <do> PATH: <the system's words>; <what to do>` for an OSError that escaped a verb (or an experiment's
    command line: experiments/harness.py); `last_checkpoint`: the one a training verb keeps, named on a full disk.
    One raised with words of its own and no errno (our `FileNotFoundError("...: no such checkpoint directory")`)
    is said as it is; the system's own (`[Errno 2] No such file or directory: 'x'`) get the path and a fix."""
    if e.errno is None and str(e):
        return str(e)
    name = e.filename if isinstance(e.filename, (str, bytes, os.PathLike)) else None  # not a file descriptor
    path = Path(os.fsdecode(name)) if name is not None else None
    where = "" if path is None else f" {path}" + (
        f" -> {os.fsdecode(e.filename2)}" if isinstance(e.filename2, (str, bytes)) else "")  # a rename's target
    reason = e.strerror or str(e) or type(e).__name__
    exists = path is not None and os.path.lexists(path)
    code = e.errno
    if code in (errno.EACCES, errno.EPERM):
        do = "create" if not exists else "read" if not os.access(path, os.R_OK) else "write"
        fix = "pick a folder you can write to, or fix its permissions (or its parent's)"
    elif code == errno.EROFS:
        do, fix = "write", "choose a folder on a writable disk"
    elif code in (errno.ENOSPC, errno.EDQUOT):
        do, fix = "write", "free some space or choose a folder on another disk"
        if last_checkpoint is not None:
            fix += f"; checkpoint {last_checkpoint} is kept, and the same command resumes from it"
    elif code == errno.EEXIST and exists and not path.is_dir():
        do, fix = "create the folder", "it is a file: choose another path or remove the file"
    elif code == errno.EEXIST:
        do, fix = "create", "choose another path or remove what is there"
    elif code == errno.ENOTDIR and path is not None:
        file = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        do = "use"
        fix = (f"{file} is a file, not a folder: " if file is not None else "") + \
            "choose another path or move the file out of the way"
    elif code == errno.EISDIR:
        do, fix = "use", "it is a folder: give the path of a file"
    elif code in (errno.EMFILE, errno.ENFILE):
        do, fix = "open", "raise the limit (ulimit -n) and run again"
    elif code == errno.ENAMETOOLONG:
        do, fix = "use", "choose a shorter path"
    elif code == errno.EIO:
        do, fix = "use", "the disk reported an error: check it (dmesg), or choose another disk"
    else:
        do, fix = "use", "check the path and the disk it is on"
    return f"cannot {do}{where}: {reason}; {fix}" if where else f"{reason}; {fix}"
