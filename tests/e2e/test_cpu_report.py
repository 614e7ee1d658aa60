"""tests/support/cpu_report.py on a pytest session of its own, under pytest-xdist as the suite runs: each file's
row counts the CPU its tests spent in their own process apart from their subprocesses'."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}:\n    pass\n"
ROW = re.compile(r"^\s*([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\S+)$")


def test_each_file_row_splits_its_tests_cpu_from_their_subprocesses(tmp_path):
    tests = tmp_path / "tests" / "unit"
    tests.mkdir(parents=True)
    (tests / "test_own.py").write_text("def test_burns_here():\n" + "".join(
        f"    {line}\n" for line in BURN.format(s=0.4).splitlines()))
    (tests / "test_children.py").write_text(
        "import subprocess, sys\n\n\ndef test_burns_in_a_child():\n"
        f"    subprocess.run([sys.executable, '-c', {BURN.format(s=0.4)!r}], check=True)\n\n\n"
        "def test_idle():\n    pass\n")
    # only xdist of the installed plugins: the others' imports (jax's, tensorflow's) would be most of its time
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist", "-n", "2",
                           "-p", "tests.support.cpu_report", "tests"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out, by_test = done.stdout.split("CPU by file")[1].split("CPU by test")
    rows = {m.group(6): [float(m.group(i)) for i in range(1, 6)] for m in map(ROW.match, out.splitlines()) if m}
    tests = [line.split()[-1] for line in by_test.splitlines() if re.match(r"^\s*[\d.]+\s+[\d.]+\s+[\d.]+\s+\S", line)]
    assert tests[-1] == "tests/unit/test_children.py::test_idle" and len(tests) == 3, by_test
    own, children = rows["tests/unit/test_own.py"], rows["tests/unit/test_children.py"]
    assert own[1] >= 0.35 and own[2] < 0.1 and own[4] == 1, rows
    assert children[2] >= 0.35 and children[1] < 0.3 and children[4] == 2, rows
    assert abs(own[0] - own[1] - own[2]) < 0.11  # the total is the two parts (each rounded to 0.1 s)
    summary = json.loads(next(line for line in by_test.splitlines() if line.startswith("{")))
    assert set(summary["by_tier"]) == {"unit"} and summary["cpu_s"] >= 0.7, summary
