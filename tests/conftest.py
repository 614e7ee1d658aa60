"""Every test sees 8 fake CPU devices, so sharding runs on a laptop (must happen before jax starts)."""

import os
from pathlib import Path

import pytest

os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    + ["--xla_force_host_platform_device_count=8"]
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the repo (data and notes); absent on a user's fresh clone."""
    if not SHARED.is_dir():
        pytest.skip(f"shared data not found at {SHARED} (only this project's machines have it)")
    return SHARED
