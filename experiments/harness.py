"""The one way the experiments make their runs. Table 5, the layer sweep and the diagnosis (experiments/paper),
the GLUE and RACE tables (experiments/glue) and the optimizer study (experiments/optimizers) differ only in
their grids and their tables.

A run is a typed config (PretrainConfig or FinetuneConfig, built with dataclasses.replace), a workdir, and for
fine-tuning what it starts from. It ends in one record: a JSON summary of its outcome, which the sweep writes
(`summarize`). One done rule: a run is finished when its record exists, as <workdir>/record.json or as the
kept copy under the sweep's records folder. The copy is committed with the results, so a fresh clone, or a
sweep spanning sessions, resumes without the run workdirs (the copy is put back into the workdir). A
fine-tuning run's record keeps a digest of its settings (`settings`): a record found under the same workdir
but made with others (another config, --init model or data: a --quick pipeline under the same --out, a
sweep rerun with --set) stops the sweep with one line instead of counting as this run's.

Runs execute in this process, one at a time, through pretrain.run and finetune.run, for three reasons. The
outcome is a value (gpt1_jax/loop.py: finished, preempted or diverged). The imports and the compiled
programs are shared by every run of a sweep (a process per run paid ~2 s of imports and its compilations
again). And a SIGTERM stops the run at a checkpoint and the sweep after it. A project error in one run (a
split that is not there, a bad path) is that run's one-line error: it keeps no record, and the others go on;
except no network to download GLUE from, which every later run would meet too: that line ends the sweep (offline,
tensorflow-datasets tasks prepared before still need --data-dir for the rest). Anything else is a bug and stops
the sweep with its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import NoReturn
from pathlib import Path

import jax

from gpt1_jax import distributed, finetune, hugepages, pretrain  # modules: tests patch pretrain.run, finetune.run
from gpt1_jax.arguments import Parser, at_least
from gpt1_jax.cli import MAX_SIMULATED_DEVICES, simulate_devices
from gpt1_jax.config import (FinetuneConfig, PretrainConfig, check_not_derived, flat_fields, given_keys, task_key,
                             to_dict)
from gpt1_jax.data.glue import GlueDownloadError, glue_task
from gpt1_jax.errors import DEBUG_ENV, ConfigError, GPT1JaxError, Interrupted, WorkdirError, os_error_message
from gpt1_jax.files import atomic_write_text
from gpt1_jax.integrity import DIGESTS, checkpoint_steps
from gpt1_jax.interrupt import CtrlC, ctrl_c_passed_to_jax, unwrapped_interrupts
from gpt1_jax.loop import Outcome
from gpt1_jax.metrics import close_open_bars
from gpt1_jax.workdir import RESUMABLE_WITH_OTHER, hold, read as run_held

RECORD = "record.json"
# What a record kept before one of `same`'s fields was added to records means by lacking it: the optimizer study's
# runs made before its --set existed ran with none.
ABSENT_MEANS = {"sets": []}
SETTINGS = "settings"  # the record's digest of what decided its score (`settings`)
# How a fine-tuning run computes, besides what may change when it resumes: not what it computes. Its dtype
# among them: a sweep run with `--set model.dtype=bfloat16` (where bf16 is native; the committed sweeps are fp32)
# takes an fp32 run's kept record as its own, and the other way round (whether bf16 moves a score: the "one cell
# both ways" check in experiments/paper/README.md).
HOW_IT_RUNS = (*RESUMABLE_WITH_OTHER, "model.dtype", "model.scan_layers")


@dataclasses.dataclass(frozen=True)
class Run:
    config: PretrainConfig | FinetuneConfig
    workdir: Path
    init: str | None = None  # fine-tuning: a run workdir, a checkpoint folder, scratch:DIR or none
    data_dir: str | None = None  # fine-tuning: GLUE's TSV files or RACE's archive (None: tensorflow-datasets)
    tfds_dir: str | None = None

    def start(self, progress: bool = True) -> Outcome:
        """Trains (or resumes) the run in this process -> how it ended."""
        if isinstance(self.config, PretrainConfig):
            return pretrain.run(self.config, self.workdir, progress=progress)
        return finetune.run(self.config, self.workdir, init=self.init, data_dir=self.data_dir,
                            tfds_dir=self.tfds_dir, progress=progress)


@dataclasses.dataclass(frozen=True)
class Done:
    """A run that ended: its record, or the one line saying why it has none."""

    run: Run
    record: dict | None = None
    error: str | None = None
    seconds: float = 0.0  # wall-clock of the run made now (0: it had finished before)


Summarize = Callable[[Run, Outcome, float], "dict | None"]  # (run, its outcome, wall seconds) -> record; None: none


@dataclasses.dataclass(frozen=True)
class Records:
    """Where a sweep's finished runs are: <workdir>/record.json for each workdir under `out`, and the kept
    copies, kept/<workdir relative to out>.json. With train=False a run without a record is an error (a
    rebuild of the tables from the kept records trains nothing)."""

    out: Path
    kept: Path | None = None
    train: bool = True

    def kept_path(self, workdir: Path) -> Path | None:
        # f-string, not with_suffix: a run named "lr0.001_s0" has a dot
        return None if self.kept is None else self.kept / f"{Path(workdir).relative_to(self.out)}.json"

    def load(self, workdir: Path, same: dict | None = None) -> dict | None:
        """The run's record (a kept copy is put back into the workdir), or None. A record whose fields differ
        from `same` was made under another budget or with other settings: its score is not comparable, and the
        sweep stops with one line, a ConfigError: `main`'s "PROG: error: ..." and exit status 2, as every other
        refusal (a SystemExit printed its bare text, exit 1). (Records from before `settings` was kept are not
        compared on it.)"""
        done, kept = Path(workdir) / RECORD, self.kept_path(workdir)
        if not done.is_file() and kept is not None and kept.is_file():
            done.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(kept, done)
        if not done.is_file():
            return None
        record = json.loads(done.read_text())
        if SETTINGS in (same or {}) and record.get(SETTINGS, same[SETTINGS]) != same[SETTINGS]:
            raise ConfigError(f"{workdir}: finished with other settings than this sweep's (its config, the model its "
                              "--init holds or its data differ): give this sweep its own --out (and records), or "
                              "repeat that sweep's own flags")
        other = {k: mine for k, v in (same or {}).items()
                 if k != SETTINGS and (mine := record.get(k, ABSENT_MEANS.get(k))) != v}
        if other:
            theirs, ours = (", ".join(f"{k}={values[k]}" for k in other) for values in (other, same))
            raise ConfigError(f"{workdir}: finished under another budget ({theirs}; this sweep: {ours}); give it its "
                              "own --out and records")
        return record

    def save(self, workdir: Path, record: dict) -> None:
        """Both copies, each written whole or not at all (a half-written record would stop a resumed sweep)."""
        text = json.dumps(finite(record), indent=2) + "\n"
        Path(workdir).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(workdir) / RECORD, text)
        if (kept := self.kept_path(workdir)) is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(kept, text)

    def finished(self, under: str = "") -> list[dict]:
        """Every record under out/`under`: the workdirs' and the kept copies (all a fresh clone has); a run found
        in both counts once, as its workdir has it."""
        found = {}
        if self.kept is not None:
            found = {p.relative_to(self.kept).with_suffix("").as_posix(): p for p in sorted((self.kept / under).rglob("*.json"))}
        for p in sorted((self.out / under).rglob(RECORD)):
            found[p.parent.relative_to(self.out).as_posix()] = p
        return [json.loads(p.read_text()) for p in found.values()]


def make(run: Run, records: Records, summarize: Summarize, same: dict | None = None, progress: bool = True,
         announce: str | None = None) -> Done | None:
    """The run's record: found, or made now by training it -> Done; None when the run stopped at a checkpoint
    before its end (SIGTERM), or was asked to stop with its last step (its record is kept): the sweep stops, and
    the same command resumes it. `announce`: a line printed only when the run starts."""
    # A rebuild from kept records (train=False) reads them as they are: their digest names the data folder of the
    # machine that made them, which a rebuild is not given.
    if records.train and (digest := settings(run)) is not None:
        same = {**(same or {}), SETTINGS: digest}
    if (record := records.load(run.workdir, same)) is not None:
        return Done(run, record)
    if not records.train:
        raise FileNotFoundError(f"no kept record for {run.workdir}: a rebuild trains nothing")
    if announce:
        print(announce, file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        outcome = run.start(progress)
    except GlueDownloadError:  # no network: every run after it would fail the same way, after its own wait
        raise
    except (GPT1JaxError, OSError) as e:  # this run's inputs; the sweep goes on
        close_open_bars()
        return Done(run, error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    if outcome.status == "preempted":
        # In several processes the stop is JAX's notice to all of them, which a Ctrl-C in any one of them posts too.
        why = "SIGTERM, or Ctrl-C in one of the job's processes" if distributed.is_multi_process() else "SIGTERM"
        print(f"{run.workdir}: stopped at step {outcome.step} ({why}); the same command resumes", file=sys.stderr)
        return None
    record = summarize(run, outcome, seconds)
    if record is None:
        return Done(run, error=outcome.message or f"no record ({outcome.status})", seconds=seconds)
    if digest is not None:
        record = {**record, SETTINGS: digest}
    records.save(run.workdir, record)
    if outcome.stop_requested:  # the stop came with the run's last step: the run is done, the sweep stops here
        print(f"{run.workdir}: finished, then stopped (SIGTERM or Ctrl-C); the same command resumes", file=sys.stderr)
        return None
    return Done(run, record, seconds=seconds)


class RunFailed(GPT1JaxError):
    """A run of a sweep that must have every record (the optimizer study: what it runs next depends on them) failed."""


def record_of(done: Done | None) -> dict | None:
    """`make`'s result for such a sweep: the record, or None when the run stopped at a checkpoint (the sweep stops;
    the same command resumes). A run that failed ends the sweep with its one line: it was taken for a stop ("the
    same command resumes", status 130), and the same command only failed again."""
    if done is not None and done.error is not None:
        raise RunFailed(f"{done.run.workdir}: {done.error}")
    return None if done is None else done.record


def settings(run: Run) -> str | None:
    """A fine-tuning run's settings as a digest: its config less how it runs (`HOW_IT_RUNS`), and what its --init
    holds (its files' contents, not its path: a kept record comes back under another one on a fresh clone).
    None for pre-training runs (their sweep compares its budget, `same`). The data are in it by content too: the
    task's files under --data-dir (the same GLUE files sit under another path on each machine), or "tfds"."""
    if not isinstance(run.config, FinetuneConfig):
        return None
    fields = {k: v for k, v in flat_fields(to_dict(run.config)).items()
              if not any(k == f or k.startswith(f + ".") for f in HOW_IT_RUNS)}
    init = run.init or "none"
    kind, folder = ("scratch", init.removeprefix("scratch:")) if init.startswith("scratch:") else ("init", init)
    held = "none" if init == "none" else _contents(Path(folder).resolve())
    text = json.dumps({"config": fields, "init": [kind, held], "data": _data(run)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _data(run: Run) -> str:
    """The fine-tuning data as a digest: RACE's archive (or folder), or the task's folder of GLUE TSV files."""
    if run.data_dir is None:
        return "tfds"  # tensorflow-datasets' own GLUE, versioned by tfds
    where = Path(run.data_dir).resolve()
    if run.config.task != "race" and where.is_dir():
        where = where / glue_task(run.config.task).dirname
    if where.is_file():
        return _files_digest([where], where.parent)
    return _files_digest(sorted(p for p in where.rglob("*") if p.is_file()) if where.is_dir() else [], where)


def _contents(folder: Path) -> str:
    """What a model folder holds, as a digest: a run workdir's newest checkpoint (its recorded digests), or the
    files of a checkpoint or HF folder (its model card aside, which is rewritten without the weights changing)."""
    if (checkpoints := folder / "checkpoints").is_dir():  # a run: its newest checkpoint's integrity.json
        recorded = [checkpoints / str(s) / DIGESTS for s in reversed(checkpoint_steps(checkpoints))]
        digests = next((p for p in recorded if p.is_file()), None)
        return hashlib.sha256(digests.read_bytes()).hexdigest() if digests else "no checkpoint"
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".md") if folder.is_dir() else []
    return _files_digest(files, folder)


def _files_digest(files: list[Path], folder: Path) -> str:
    return _digest(tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files), folder)


@functools.lru_cache(maxsize=16)
def _digest(files: tuple[tuple[str, int, int], ...], folder: Path) -> str:
    """sha256 over the files' names (relative to `folder`) and contents, keyed by their sizes and mtimes: once per
    process while they are unchanged (a sweep asks once per run)."""
    h = hashlib.sha256()
    for name, _, _ in files:
        h.update(str(Path(name).relative_to(folder)).encode() + b"\0")
        with open(name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


@dataclasses.dataclass
class Count:
    """One count over the runs of a stage that sweeps several times (Table 5: each arm's lr grid, then its seeds;
    75 runs at the laptop budget): `total`, the runs it plans, and each run's number, given the first time one of
    its sweeps lists it. A run two sweeps list (the seed-0 run at the chosen lr is in the grid and in the seeds)
    keeps its one number. The stage adds the runs it decides on the way (an lr grid's extension: `total += 1`)."""

    total: int
    numbers: dict[Path, int] = dataclasses.field(default_factory=dict)

    def number(self, workdir: Path) -> tuple[int, bool]:
        """-> (the run's number, whether this is the first time it is listed)."""
        if workdir in self.numbers:
            return self.numbers[workdir], False
        self.numbers[workdir] = len(self.numbers) + 1
        self.total = max(self.total, len(self.numbers))
        return self.numbers[workdir], True

    @contextlib.contextmanager
    def group(self, planned: int) -> Iterator[None]:
        """A part of the stage planned as `planned` runs (one arm's grid and seeds on one task): the runs it leaves
        unlisted leave the total too (every lr of its grid failed: no seed to run; a task --tasks leaves out that
        no record finishes)."""
        listed, total = len(self.numbers), self.total
        try:
            yield
        finally:
            added = self.total - total  # its grid's extensions
            self.total -= planned + added - (len(self.numbers) - listed)


def sweep(runs: Iterable[Run], records: Records, summarize: Summarize,
          on_done: Callable[[Done], None] | None = None, count: Count | None = None) -> list[Done] | None:
    """make() for each run in turn, printing where it is -> every run's Done; None when one stopped at a
    checkpoint (the runs after it did not start). `on_done(done)` follows each run that ended, so a sweep stopped
    midway has kept what finished. `count`: the stage's count over its sweeps (default: this sweep's own); a run
    an earlier sweep of it listed is not announced again, unless it starts now (it failed then). Process 0 speaks
    for a multi-process job, as gpt1-jax's verbs do (each line came once per process)."""
    runs, dones = list(runs), []
    count = count or Count(len(runs))
    speaks = not distributed.is_multi_process() or jax.process_index() == 0
    for run in runs:
        number, first = count.number(run.workdir)
        line = f"[{number}/{count.total}] {run.workdir}"
        if first and speaks:
            print(line, file=sys.stderr, flush=True)
        done = make(run, records, summarize, announce=None if first or not speaks else line)
        if done is None:
            return None
        if done.error and speaks:
            print(f"    failed: {done.error}", file=sys.stderr)
        elif first and not done.seconds and speaks:
            print("    done before", file=sys.stderr)
        dones.append(done)
        if on_done is not None:
            on_done(done)
    return dones


def finite(obj):
    """JSON has no NaN: an undefined score is written as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def finetune_record(run: Run, outcome: Outcome, seconds: float) -> dict | None:
    """A finished fine-tuning run's results.json as its record, without what names this machine (paths) or
    repeats the config; a diverged run has none (its error says why)."""
    if not outcome.finished:
        return None
    return {k: v for k, v in outcome.results.items() if k not in ("config", "init", "predictions", "submission")}


def leave(status: int) -> NoReturn:
    """The script's exit with `status`; after a stop (130) without the interpreter's teardown: a signal that cut a
    run's start (orbax's checkpoint manager half made) left threads whose teardown segfaulted, exit 139 after the
    "interrupted" line. Everything worth keeping is on disk by then (the loop saved, or the run had not begun)."""
    if status == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def prog(module: str) -> str:
    """A script's name in its --help and its one-line messages (`PROG = harness.prog(__spec__.name)`): the command
    that runs it, `python -m experiments.paper.run`. argparse took the file's (`run.py: error: ...`, and `see run.py
    --help`, which runs nothing: the scripts run as modules), and the scripts named themselves four ways."""
    return f"python -m {module}"


def parser(description: str, **kwargs) -> argparse.ArgumentParser:
    """Every experiment script's argument parser: `gpt1-jax`'s (gpt1_jax/arguments.py Parser), so a script's flags
    read as the command line's. With argparse's own, a missing required flag hid an unknown one (`run_study --bogus`
    said only "the following arguments are required: study, --out"); Parser names the unknown one first, and each
    error is one line, exit status 2. No abbreviations: a misspelt flag is an error, not another flag."""
    return Parser(description=description, allow_abbrev=False, **kwargs)


def cpu_devices_flag(p: argparse.ArgumentParser) -> None:
    """--cpu-devices, one flag for the scripts whose runs only score (the paper pipeline, the GLUE and RACE tables):
    how a run is split, not what it computes (the same dropout masks, sums in another order), so a kept record
    counts whatever the split it was made on (`settings` digests the config, not the devices). The optimizer study
    has none: its tables compare training seconds, which a split moves, and its committed runs trained on one."""
    p.add_argument("--cpu-devices", type=at_least(1, at_most=MAX_SIMULATED_DEVICES), default=1, metavar="N",
                   help="split this CPU into N XLA devices that train data-parallel (gpt1-jax's --simulate-devices): "
                   "on a 2-core CPU, 2 ran the release's steps 11-16%% faster than 1 on the AVX2 kind, 1-7%% on the "
                   "AVX-512 one (experiments/bench/README.md); the batch sizes must divide by N (default: 1)")


def split_cpu(devices: int, config: FinetuneConfig | None = None) -> None:
    """The --cpu-devices split: before jax starts its backend (the first computation), so first in a script's main.
    With the `config` every run of a sweep shares the batch sizes of, those are checked against the split now: a
    split that does not divide them failed each run with the same line, into a table of failed cells."""
    simulate_devices(devices if devices > 1 else None)
    if config is not None:
        try:
            finetune.check_batches(config)
        except ConfigError as e:
            if devices == 1:  # not the split's doing (a --set mesh or batch size)
                raise
            raise ConfigError(f"--cpu-devices {devices}: {e}") from None


def seed_list(text: str) -> list[int]:
    """A --seeds value, the same in every experiment (comma-separated, as their other lists): distinct whole
    numbers; a bad one is argparse's one-line error."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}")
    if len(set(seeds)) < len(seeds):
        raise argparse.ArgumentTypeError(f"a seed is given twice in {text!r}")
    return seeds


def name_list(kind: str) -> Callable[[str], list[str]]:
    """The type of a list flag of names (--tasks, --ablations, --optimizers), the same in every experiment: comma-
    separated `kind`s, none empty, none twice; a bad one is argparse's one-line error. An empty value read as no
    list at all: `run_study --optimizers ''` ran every optimizer, `glue_table --tasks ''` every task."""
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",")]
        if not all(names):
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind} names, got {text!r}")
        if len(set(names)) < len(names):
            raise argparse.ArgumentTypeError(f"a {kind} is given twice in {text!r}")
        return names
    parse.__name__ = f"{kind} list"  # argparse names the type in some errors
    return parse


def task_names(names: list[str]) -> list[str]:
    """--tasks: known fine-tuning tasks in their canonical spelling (SST-2 -> sst2), none twice (SST-2,sst2), or one
    ConfigError: checked with the flags, before a study folder or a run is made for one."""
    tasks = [task_key(t) for t in names]
    if len(set(tasks)) < len(tasks):
        raise ConfigError(f"a task is given twice in {','.join(names)!r}")
    return tasks


def check_sets(sets: list[str], owned: dict[str, str]) -> None:
    """Refuses (ConfigError, one line) a --set of every run of a sweep that no run would keep: a field fine-tuning
    derives, or one the sweep sets per run (`owned`: key -> what sets it), which replaced the --set silently."""
    given = given_keys(sets)
    if taken := sorted(given & set(owned)):
        raise ConfigError(f"{taken[0]} is set for each run by {owned[taken[0]]}, not by --set")
    check_not_derived(given)


def check_out(out: Path, init: str | None = None) -> None:
    """Refuses (WorkdirError, one line) an --out that is a gpt1-jax run folder, or the --init source itself: the
    sweep's run folders, tables and plots landed among that run's checkpoints (`glue_table --init RUN --out RUN`
    exited 0). Reads, writes nothing."""
    out = Path(out)
    source = None if init in (None, "none") else Path(init.removeprefix("scratch:"))
    if source is not None and out.is_dir() and out.resolve() == source.resolve():
        raise WorkdirError(f"--out {out} is the --init source: the sweep would write its runs and tables into the "
                           "model it starts from; choose another --out")
    if out.is_dir() and (held := run_held(out)) is not None:
        raise WorkdirError(f"--out {out} holds {held.describe()}: the sweep would write its runs and tables into "
                           "it; choose another --out (a new or empty folder, or an earlier sweep's)")


@contextlib.contextmanager
def one_sweep(out: Path, prog: str, *, init: str | None = None, under: str = "") -> Iterator[None]:
    """Holds an experiment's --out (its folder `under` it) while its sweep runs (process 0 of a job), so that a
    second sweep started on the same folder is refused in one line, after `check_out` refused an --out that is a run
    folder or the --init source. Each run's folder has its own lock, so a second quick glue_table on one --out
    skipped the run the first was training as a failure and wrote table.md from the records so far (one seed's
    score), over the first one's if it ended last."""
    check_out(out, init)
    main = not distributed.is_multi_process() or jax.process_index() == 0
    with hold(Path(out) / under, prog, enabled=main, writes="the same runs' records and tables",
              held_by="a sweep running there now"):
        yield


def main(fn: Callable[[], int | None], prog: str, *, trains: bool = False) -> int:
    """Runs an experiment's command line: Ctrl-C or SIGTERM, between two runs too, stops it with one line (the run
    in progress saved a checkpoint, or had none yet) and exit status 130; the same command resumes. A project error
    or an OSError that escapes (a bad --tasks, an --out that is a file) is one line and exit status 2, as
    `gpt1-jax`'s (gpt1_jax/cli.py); anything else is a bug and keeps its traceback. In a multi-process run
    (gpt1_jax.distributed started first) SIGTERM stays JAX's preemption notice: the processes agree on a step of the
    run in progress, or of the next one, and stop there together (gpt1_jax/loop.py); taken here, it stopped the
    process that got it alone (status 130) and left the others to fail in their next collective. A first Ctrl-C there
    is passed on to JAX as such a notice (gpt1_jax/interrupt.py); a second one stops that process at once.

    `trains`: the script's runs train for hours, so its command line first re-executes itself keeping glibc's heap
    (gpt1_jax/hugepages.py: steps 4-7% faster than under huge pages alone, ~31% than on plain pages, for more
    memory), unless GPT1_JAX_HUGE_PAGES says otherwise."""
    if getattr(fn, "__module__", None) == "__main__":  # the script's own command line, not a test calling main
        if trains and not distributed.is_multi_process():  # a process that joined a job must not restart
            hugepages.reexec_with_huge_pages(default="keep")
        gc.freeze()  # what the imports made, out of the collector's walks, as gpt1_jax/cli.py's main does
    multi = distributed.is_multi_process()
    signals = (signal.SIGINT,) if multi else (signal.SIGINT, signal.SIGTERM)
    with CtrlC(signals=signals, first_to_jax=multi) as guard:  # re-raises one Python dropped in a gc callback
        try:
            with unwrapped_interrupts():  # one that JAX's C++ wrapped in another error is Ctrl-C all the same
                status = fn() or 0
            if status == 0 and ctrl_c_passed_to_jax():  # its line said every process would stop: none was left to
                print(f"{prog}: the Ctrl-C came after the last run's last step: nothing was left to stop",
                      file=sys.stderr)
            return status
        except KeyboardInterrupt as e:
            guard.caught()
            close_open_bars()
            what = e if isinstance(e, Interrupted) else f"interrupted{f': {e}' if str(e) else ''}; the same command resumes"
            print(f"{prog}: {what}", file=sys.stderr)  # Interrupted: the loop says what it saved, and how to resume
            return 130
        except (GPT1JaxError, OSError) as e:  # a project error (gpt1_jax/errors.py), a path, a disk
            if os.environ.get(DEBUG_ENV):
                raise
            close_open_bars()
            message = e if isinstance(e, GPT1JaxError) else os_error_message(e)
            print(f"{prog}: error: {message}", file=sys.stderr)
            return 2
