"""gpt1_jax/hugepages.py: when a long run re-executes itself under glibc's huge-page tunable, or keeping its heap
(the re-execution itself: tests/e2e/test_bench.py)."""

import pytest

from gpt1_jax import hugepages
from tests.support.hugepages import NEW_GLIBC


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


@pytest.mark.skipif(not NEW_GLIBC, reason="needs Linux with glibc >= 2.35")
def test_keep_adds_the_kept_heap_whatever_the_thp_mode_and_leaves_a_users_own_values(thp):
    keep = {hugepages.SWITCH: "keep"}
    thp.write_text("always [madvise] never\n")
    assert hugepages._missing(keep) == [hugepages.TUNABLE, *hugepages.KEEP]
    thp.write_text("[always] madvise never\n")  # no huge-page request to make; the heap is still worth keeping
    assert hugepages._missing(keep) == list(hugepages.KEEP)
    mine = {**keep, "GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}
    assert hugepages._missing(mine) == list(hugepages.KEEP[:2])  # their arena_max stays theirs
    done = {**keep, "GLIBC_TUNABLES": ":".join(hugepages.KEEP)}
    assert not hugepages.wanted(done) and hugepages.kept_heap(done) and not hugepages.kept_heap({})


def test_an_unknown_switch_value_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        hugepages.wanted({hugepages.SWITCH: "kep"})
    assert stop.value.code == 2
    assert capsys.readouterr().err == "gpt1-jax: GPT1_JAX_HUGE_PAGES='kep': expected off, on or keep\n"


@pytest.mark.skipif(not NEW_GLIBC, reason="needs Linux with glibc >= 2.35")
def test_a_default_mode_applies_only_where_the_switch_is_unset(thp):
    """The experiments' training scripts default to the kept heap (experiments/harness.py `main`, `trains`); a user's
    GPT1_JAX_HUGE_PAGES still decides."""
    thp.write_text("always [madvise] never\n")
    assert hugepages._missing({}, default="keep") == [hugepages.TUNABLE, *hugepages.KEEP]
    assert hugepages._missing({hugepages.SWITCH: ""}, default="keep") == [hugepages.TUNABLE, *hugepages.KEEP]
    assert hugepages._missing({hugepages.SWITCH: "on"}, default="keep") == [hugepages.TUNABLE]
    assert hugepages._missing({hugepages.SWITCH: "off"}, default="keep") == []
    assert hugepages._missing({}) == [hugepages.TUNABLE]  # the verbs' default
