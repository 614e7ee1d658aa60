"""A pytest plugin that says where the suite's CPU goes, file by file: `-p tests.support.cpu_report`.

On 2 cores both pytest-xdist workers are busy, so the suite's length is its CPU-seconds over two; --durations ranks
wall-clock, which counts a test waiting on a timeout as much as one compiling. This counts, per test, the CPU of
the test's own process and of the subprocesses it started and waited for (a whole run of `gpt1-jax`, a
multi-process launch), and prints the files that used most, the tests that used most (a module's fixtures are its
first test's), then one JSON line for the whole suite.
"""

from __future__ import annotations

import collections
import json
import resource

import pytest

TOP = 25  # files listed, and tests


def _cpu() -> tuple[float, float]:
    """(this process's CPU seconds, its waited-for children's)"""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


_START = pytest.StashKey[tuple[float, float]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_START] = _cpu()  # before its fixtures are made: a module's fixture is its first test's CPU


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The setup report carries the CPU counters at the test's start, the teardown report at its end: reports are
    what travels from a pytest-xdist worker to the controller, which adds them up."""
    outcome = yield
    if call.when in ("setup", "teardown") and _START in item.stash:
        report = outcome.get_result()
        report.user_properties = [*report.user_properties,
                                  (f"cpu_{call.when}", item.stash[_START] if call.when == "setup" else _cpu())]


_WALL: collections.Counter = collections.Counter()  # file -> its tests' wall-clock, every phase
_STARTED: dict[str, tuple[float, float]] = {}
_BY_TEST: dict[str, tuple[float, float]] = {}  # own CPU, children's CPU


def pytest_runtest_logreport(report):
    _WALL[report.nodeid.split("::")[0]] += report.duration
    props = dict(report.user_properties)
    if "cpu_setup" in props and report.when == "setup":
        _STARTED[report.nodeid] = props["cpu_setup"]
    elif "cpu_teardown" in props and report.nodeid in _STARTED:
        (own0, children0), (own1, children1) = _STARTED.pop(report.nodeid), props["cpu_teardown"]
        _BY_TEST[report.nodeid] = (own1 - own0, children1 - children0)


def pytest_terminal_summary(terminalreporter):
    by_file = collections.defaultdict(lambda: [0, 0.0, 0.0])  # tests, own CPU, children's CPU
    for test, (own, children) in _BY_TEST.items():
        row = by_file[test.split("::")[0]]
        row[0], row[1], row[2] = row[0] + 1, row[1] + own, row[2] + children
    rows = sorted(by_file.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
    write = terminalreporter.write_line
    terminalreporter.section("CPU by file (the test's process + the subprocesses it waited for)")
    write(f"{'CPU s':>7} {'own':>7} {'children':>8} {'wall s':>7} {'tests':>5}  file")
    for path, (n, own, children) in rows[:TOP]:
        write(f"{own + children:7.1f} {own:7.1f} {children:8.1f} {_WALL[path]:7.1f} {n:5d}  {path}")
    terminalreporter.section("CPU by test")
    write(f"{'CPU s':>7} {'own':>7} {'children':>8}  test")
    for test, (own, children) in sorted(_BY_TEST.items(), key=lambda kv: -sum(kv[1]))[:TOP]:
        write(f"{own + children:7.1f} {own:7.1f} {children:8.1f}  {test}")
    tiers = collections.Counter()
    for path, (n, own, children) in rows:
        tiers[path.split("/")[1] if path.count("/") > 1 else path] += own + children
    write(json.dumps({"cpu_s": round(sum(tiers.values()), 1), "by_tier": {k: round(v, 1) for k, v in tiers.items()}}))
