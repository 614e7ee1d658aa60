"""An experiment's training script re-executes its command line under glibc's kept heap (experiments/harness.py
`main`, `trains`; gpt1_jax/hugepages.py), in its own process id; a script that does not train is left as it is."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpt1_jax import hugepages
from tests.support.hugepages import NEW_GLIBC

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import os, sys
from experiments import harness
from gpt1_jax import hugepages
def main():
    print(os.getpid(), hugepages.kept_heap(), os.environ.get("GLIBC_TUNABLES", ""), flush=True)
harness.leave(harness.main(main, "probe", trains=sys.argv[1] == "trains"))
"""


@pytest.mark.skipif(not NEW_GLIBC, reason="needs Linux with glibc >= 2.35")
@pytest.mark.parametrize("trains", [True, False])
def test_a_training_scripts_command_line_keeps_the_heap_unless_told_otherwise(tmp_path, trains):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in (hugepages.SWITCH, "GLIBC_TUNABLES")}
    proc = subprocess.Popen([sys.executable, str(script), "trains" if trains else "plain"], cwd=ROOT,
                            env={**env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    pid, kept, tunables = out.split("\n")[0].split(" ", 2)
    assert int(pid) == proc.pid  # re-executed in place: a launcher's or scheduler's signals still reach it
    assert kept == str(trains)
    assert all(t in tunables.split(":") for t in hugepages.KEEP) == trains, tunables
