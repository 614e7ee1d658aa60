"""tests/fixtures/ stands in for ../shared on a fresh clone: its generated files are current, and where
../shared exists, they agree with the real data on everything the other tests rely on."""

import subprocess
import sys
from pathlib import Path


MAKE_VOCAB = Path(__file__).resolve().parents[1] / "fixtures" / "make_vocab.py"


def test_generated_vocabulary_is_current():
    done = subprocess.run([sys.executable, str(MAKE_VOCAB), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
