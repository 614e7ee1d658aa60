"""gpt1_jax/hugepages.py: when a long run re-executes itself under glibc's huge-page tunable (the re-execution
itself: tests/e2e/test_bench.py)."""

import platform
import sys

import pytest

from gpt1_jax import hugepages

LIBC, VERSION = platform.libc_ver()
NEW_GLIBC = sys.platform == "linux" and LIBC == "glibc" and tuple(map(int, VERSION.split(".")[:2])) >= (2, 35)


@pytest.fixture
def thp(tmp_path, monkeypatch):
    """Points the THP mode at a file the test writes."""
    mode = tmp_path / "enabled"
    monkeypatch.setattr(hugepages, "THP_MODE", mode)
    return mode


@pytest.mark.skipif(not NEW_GLIBC, reason="needs Linux with glibc >= 2.35")
def test_wanted_only_where_the_tunable_changes_something(thp):
    thp.write_text("always [madvise] never\n")
    assert hugepages.wanted({}) is True
    assert hugepages.wanted({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) is True
    # Already under it (the re-executed process), or switched off: no loop, no re-execution.
    assert hugepages.wanted({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}) is False
    for off in ("off", "0", "OFF", "false"):
        assert hugepages.wanted({hugepages.SWITCH: off}) is False
    # THP `always` maps huge pages already; `never` ignores the request; no THP at all: nothing to gain.
    for mode in ("[always] madvise never\n", "always madvise [never]\n"):
        thp.write_text(mode)
        assert hugepages.wanted({}) is False
    thp.unlink()
    assert hugepages.wanted({}) is False


def test_an_old_glibc_is_left_alone(thp, monkeypatch):
    thp.write_text("always [madvise] never\n")
    monkeypatch.setattr(hugepages.platform, "libc_ver", lambda: ("glibc", "2.31"))
    assert hugepages.wanted({}) is False
    monkeypatch.setattr(hugepages.platform, "libc_ver", lambda: ("", ""))
    assert hugepages.wanted({}) is False
