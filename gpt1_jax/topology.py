"""TPU topologies without a TPU: the TPU compiler (libtpu) loaded quietly, and what each chip offers.

`pip install -e ".[tpu]"` brings libtpu, whose compiler runs on any x86 CPU: `tpu_devices("v5e:16x16")`
gives the devices of that slice (no chip attached), a `jax.sharding.Mesh` over them, and `jax.jit`
then compiles for that TPU, so a pod plan is checked by the compiler that will run it
(gpt1_jax/plan.py). The chip table below (HBM, interconnect) is what the plan compares against; its
sources are in docs/scale.md.

Two traps of an installed libtpu on a machine with no TPU, both handled here:
* every JAX process would initialise the TPU backend on its first `jax.devices()`, print libtpu's
  start-up noise ("could not determine TPU worker hostnames", a source location trace) and hold
  libtpu's lock file, so that a second process's topology call fails. `skip_absent_tpu()` (run when
  gpt1_jax is imported) tells JAX there is no TPU backend where no TPU chip is attached.
* a topology call prints the same noise: it is captured and shown only when the call fails.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies

from gpt1_jax.errors import ConfigError

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator generation, per chip. Bandwidths in bytes/s, one direction, as a ring
    all-reduce sees them (docs/scale.md says how each was derived from the vendor's sheet)."""

    name: str
    hbm_bytes: int
    hbm_bytes_per_s: float
    ici_bytes_per_s: float  # within a slice (TPU ICI, GPU NVLink)
    dcn_bytes_per_s: float  # between slices (the data-centre network), per chip
    chips_per_host: int


_HOST_DCN = 2 * 100e9 / 8  # 2 x 100 Gbps NICs per TPU host (v5e's sheet; assumed for the others)

# Keyed by what jax's `device_kind` says. Peaks (FLOP/s) stay in gpt1_jax/flops.py.
CHIPS: dict[str, Chip] = {
    "TPU v4": Chip("v4", 32 * GiB, 1200e9, 1.1e15 / 4096, _HOST_DCN / 4, 4),
    "TPU v5 lite": Chip("v5e", 16 * 10**9, 819e9, 51.2e12 / 256, _HOST_DCN / 8, 8),
    "TPU v5": Chip("v5p", 95 * 10**9, 2765e9, 4800e9 / 8, _HOST_DCN / 4, 4),
    "TPU v6 lite": Chip("v6e", 32 * 10**9, 1638e9, 102.4e12 / 256, _HOST_DCN / 8, 8),
    "NVIDIA H100 80GB HBM3": Chip("H100", 80 * 10**9, 3.35e12, 450e9, 400e9 / 8, 8),
    "NVIDIA H200": Chip("H200", 141 * 10**9, 4.8e12, 450e9, 400e9 / 8, 8),  # SXM: the H100's links, HBM3e
}


_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_EXHAUSTED = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGTP]?)\) exceeds available HBM \(([\d.]+)([KMGTP]?)\)")


def out_of_hbm(error: BaseException) -> tuple[int, int] | None:
    """(bytes of temporaries asked for, bytes of HBM available) from the TPU compiler's RESOURCE_EXHAUSTED
    error, or None for any other error."""
    m = _EXHAUSTED.search(str(error))
    if not m:
        return None
    return (int(float(m.group(1)) * _BINARY.get(m.group(2), 1)), int(float(m.group(3)) * _BINARY.get(m.group(4), 1)))


@functools.lru_cache(maxsize=None)
def usable_hbm_bytes(device) -> int | None:
    """The HBM one chip offers a program, as the TPU compiler itself counts it (less than the sheet's
    capacity: the runtime keeps some). Asked by compiling a program that cannot fit and reading the
    refusal; None where the compiler gives no such number (not a TPU)."""
    if getattr(device, "platform", "") != "tpu":
        return None
    whole = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([device]), ("x",)), jax.sharding.PartitionSpec())
    huge = jax.jit(lambda x: jnp.broadcast_to(x, (1 << 20, 1 << 20)) * 2, out_shardings=whole)
    try:
        huge.lower(jax.ShapeDtypeStruct((1 << 20,), jnp.float32, sharding=whole)).compile()
    except Exception as e:  # the expected refusal
        found = out_of_hbm(e)
        return found[1] if found else None
    return None


def chip_of(device) -> Chip | None:
    """The table's entry for a jax device (exact `device_kind`), or None for CPUs and unknown kinds."""
    return CHIPS.get(getattr(device, "device_kind", ""))


def skip_absent_tpu() -> None:
    """Where libtpu is installed but no TPU chip is attached, the TPU backend is never initialised:
    no start-up noise on stderr, no libtpu lock held by CPU runs. A real TPU VM is left alone."""
    if "tpu" in os.environ.get("JAX_PLATFORMS", "") or os.environ.get("JAX_FORCE_TPU_INIT"):
        return
    try:  # jax's private modules, imported where their absence can be caught
        from jax._src import hardware_utils, xla_bridge
    except ImportError:  # another jax layout: nothing to do
        return
    if hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0:
        return
    # Re-registering (not removing) keeps "tpu" a known platform, so jax's TPU lowering rules and
    # topology compilation still work; the factory only declines to open a backend.
    xla_bridge.register_backend_factory("tpu", lambda: None, priority=300, fail_quietly=True)


def tpu_devices(topology: str, num_slices: int = 1) -> list:
    """The devices of TPU topology `topology` ("v5e:16x16", "v5p:8x8x8", "v4:2x2x4", "v6e:4x4") times
    `num_slices` slices over DCN; compile-only, no TPU needed. One ConfigError line when libtpu is
    missing or the name does not resolve."""
    if num_slices < 1:
        raise ConfigError(f"--num-slices must be >= 1, got {num_slices}")
    if ":" not in topology:
        raise ConfigError(f"--topology {topology!r} is not GENERATION:SHAPE, e.g. v5e:16x16, v5p:8x8x8, v4:2x2x4")
    try:  # optional: the [tpu] extra
        import libtpu  # noqa: F401
    except ImportError:
        raise ConfigError("--topology needs the TPU compiler: pip install -e \".[tpu]\" (libtpu, ~700 MB)") from None
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no cloud metadata server to ask
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # plans side by side, or beside a test run
    kwargs = {"num_slices": num_slices} if num_slices > 1 else {}
    if topology.lower().startswith(("v4", "v5p")):
        kwargs["chip_config_name"] = "megacore"  # one device per chip (its 2 TensorCores as one), as jax runs them
    with _quiet_stderr() as noise:
        try:
            desc = topologies.get_topology_desc(topology_name=topology, platform="tpu", **kwargs)
        except Exception as e:  # libtpu reports bad names as a plain RuntimeError/XlaRuntimeError
            error = e
        else:
            error = None
    if error is not None:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else noise.read().strip()[-200:]
        raise ConfigError(f"--topology {topology!r} (x{num_slices} slices) did not resolve: {detail}")
    return list(desc.devices)


class _quiet_stderr:
    """Captures file descriptor 2 (libtpu writes there from C++, past Python's sys.stderr)."""

    def __enter__(self):
        self._file = tempfile.TemporaryFile(mode="w+")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def read(self) -> str:
        self._file.seek(0)
        return self._file.read()

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        return False
