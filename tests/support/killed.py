"""What a killed process leaves behind, for the tests of what sweeps it up."""

import subprocess
import sys


def gone_pid() -> int:
    """The pid of a process that has ended: a writer killed on this host, as its lock and staging folders name it."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
