"""What tests/unit/test_launch.py and tests/e2e/test_launch.py share."""

from pathlib import Path


REPO = Path(__file__).resolve().parents[2]


LAUNCH = REPO / "launch"


README = (LAUNCH / "README.md").read_text()
