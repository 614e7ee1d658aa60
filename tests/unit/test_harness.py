"""experiments/harness.py, the one way the experiments make runs: the done rule (a record in the workdir, or
the kept copy put back), both copies written whole, a record of another budget refused, a rebuild that must
not train, one run's project error kept as its one line while the sweep goes on, a run stopped at a
checkpoint stopping the sweep without a record, and a record made with other settings not taken for this run's. The runs here return made-up outcomes; the real runs go
through it in tests/e2e (test_paper.py, test_optimizers_study.py, test_finetune.py's glue_table)."""

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gpt1_jax.finetune
from experiments import harness
from gpt1_jax.config import FinetuneConfig
from gpt1_jax.errors import ConfigError, DataError, WorkdirError
from gpt1_jax.loop import Outcome

ROOT = Path(__file__).resolve().parents[2]


def _runs(out: Path, n: int) -> list[harness.Run]:
    return [harness.Run(FinetuneConfig(task="sst2", seed=s), out / "sst2" / f"seed{s}", "none") for s in range(n)]


def _record(run, outcome, seconds):
    return {"seed": run.config.seed, "status": outcome.status, "score": float("nan")}


def test_a_record_marks_a_run_done_and_the_kept_copy_restores_it(tmp_path, monkeypatch):
    started = []

    def fake_run(config, workdir, **kwargs):
        started.append(config.seed)
        return Outcome("finished", 3)

    monkeypatch.setattr(gpt1_jax.finetune, "run", fake_run)
    records = harness.Records(tmp_path / "out", tmp_path / "kept")
    dones = harness.sweep(_runs(tmp_path / "out", 2), records, _record)
    assert started == [0, 1] and [d.record["seed"] for d in dones] == [0, 1] and all(d.seconds > 0 for d in dones)
    kept = tmp_path / "kept" / "sst2" / "seed1.json"
    assert kept.read_text() == (tmp_path / "out" / "sst2" / "seed1" / "record.json").read_text()
    assert json.loads(kept.read_text())["score"] is None  # JSON has no NaN
    assert not list(tmp_path.rglob("*.tmp*"))

    (tmp_path / "out" / "sst2" / "seed0" / "record.json").unlink()  # the workdir gone, the kept copy there
    again = harness.sweep(_runs(tmp_path / "out", 2), records, _record)
    assert started == [0, 1] and [d.seconds for d in again] == [0.0, 0.0]
    assert (tmp_path / "out" / "sst2" / "seed0" / "record.json").is_file()
    assert sorted(r["seed"] for r in records.finished()) == [0, 1]  # once each, though found twice


def test_a_stages_sweeps_share_one_count_and_a_run_is_announced_once(tmp_path, monkeypatch, capsys):
    """Table 5 sweeps each arm's lr grid, then its seeds at the chosen lr (seed 0's run in both): every sweep's runs
    were headed [1/n] of that sweep alone ("[1/1]" for each grid extension), and the seed-0 run was announced again
    as "done before" right after it ran. One count over the stage's runs, each numbered once; "done before" only
    for a run an earlier session finished; the total drops the runs a part of the stage does not list."""
    monkeypatch.setattr(gpt1_jax.finetune, "run", lambda config, workdir, **k: Outcome("finished", 3))
    records = harness.Records(tmp_path / "out")
    runs = _runs(tmp_path / "out", 4)
    records.save(runs[3].workdir, {"seed": 3})  # an earlier session's
    count = harness.Count(6)
    with count.group(3):
        assert [d.seconds > 0 for d in harness.sweep(runs[:2], records, _record, count=count)] == [True, True]
        assert len(harness.sweep([runs[0]], records, _record, count=count)) == 1  # listed again: found, not announced
    assert count.total == 5  # that part planned one run more than it listed
    harness.sweep(runs[2:], records, _record, count=count)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"[1/6] {runs[0].workdir}", f"[2/6] {runs[1].workdir}", f"[3/5] {runs[2].workdir}",
                     f"[4/5] {runs[3].workdir}", "    done before"]

    (runs[0].workdir / "record.json").unlink()  # a run listed again that has no record (it failed) is announced
    harness.sweep([runs[0]], records, _record, count=count)
    assert capsys.readouterr().err.splitlines() == [f"[1/5] {runs[0].workdir}"]
    harness.sweep(runs[:2], records, _record)  # no count: the sweep's own
    assert capsys.readouterr().err.splitlines() == [f"[1/2] {runs[0].workdir}", "    done before",
                                                    f"[2/2] {runs[1].workdir}", "    done before"]
    # a multi-process job's other processes: each of these lines came once per process ([p0] and [p1] in its log)
    monkeypatch.setattr(harness.distributed, "is_multi_process", lambda: True)
    monkeypatch.setattr(harness.jax, "process_index", lambda: 1)
    (runs[0].workdir / "record.json").unlink()
    assert len(harness.sweep(runs[:2], records, _record)) == 2 and capsys.readouterr().err == ""


def test_a_rebuild_trains_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(gpt1_jax.finetune, "run", lambda *a, **k: pytest.fail("a rebuild started a run"))
    with pytest.raises(FileNotFoundError, match="no kept record for .*seed0: a rebuild trains nothing"):
        harness.sweep(_runs(tmp_path, 1), harness.Records(tmp_path, tmp_path / "kept", train=False), _record)


def test_a_record_of_another_budget_stops_the_sweep_in_one_line(tmp_path, capsys):
    """The refusal is a ConfigError, which harness.main prints as "PROG: error: ..." with exit status 2, as every
    other one: it was a SystemExit, its bare text and exit status 1."""
    records = harness.Records(tmp_path)
    records.save(tmp_path / "run", {"steps": 6, "epochs": 1})
    assert records.load(tmp_path / "run", {"steps": 6}) == {"steps": 6, "epochs": 1}
    with pytest.raises(ConfigError, match=r"finished under another budget \(steps=6; this sweep: steps=8\)"):
        records.load(tmp_path / "run", {"steps": 8})
    with pytest.raises(ConfigError, match=r"budget \(steps=6, epochs=1; this sweep: steps=8, epochs=2\); give it"):
        records.load(tmp_path / "run", {"steps": 8, "epochs": 2})
    assert harness.main(lambda: records.load(tmp_path / "run", {"steps": 8}), "run_study") == 2
    assert capsys.readouterr().err == (f"run_study: error: {tmp_path / 'run'}: finished under another budget (steps=6; "
                                       "this sweep: steps=8); give it its own --out and records\n")


def test_one_runs_error_is_its_line_and_the_sweep_goes_on(tmp_path, monkeypatch):
    def fake_run(config, workdir, **kwargs):
        if config.seed == 0:
            raise DataError("sst2: no train split in GLUE_DIR")
        if config.seed == 1:
            return Outcome("diverged", 2, message="loss is nan at step 2")
        return Outcome("finished", 3, results={"main_metric": "accuracy", "metrics": {"accuracy": 0.5},
                                               "config": {"task": "sst2"}, "predictions": {"validation": "/abs/x.tsv"}})

    monkeypatch.setattr(gpt1_jax.finetune, "run", fake_run)
    dones = harness.sweep(_runs(tmp_path, 3), harness.Records(tmp_path), harness.finetune_record)
    assert dones[0].error == "DataError: sst2: no train split in GLUE_DIR" and dones[0].record is None
    assert dones[1].error == "loss is nan at step 2" and dones[1].record is None  # Table 5 keeps no diverged run
    assert [p.parent.name for p in tmp_path.rglob("record.json")] == ["seed2"]
    # a finished run's results.json, without the paths of this machine or the config the workdir keeps
    assert dones[2].record == {"main_metric": "accuracy", "metrics": {"accuracy": 0.5},
                               "settings": harness.settings(_runs(tmp_path, 3)[2])} and dones[2].error is None


def test_a_sweep_that_needs_every_record_ends_on_a_failed_run_with_its_line(tmp_path, monkeypatch):
    """The optimizer study took a failed run (no record) for one stopped at a checkpoint: "interrupted; the same
    command resumes", status 130, the cause never shown, and the same command failed the same way."""
    def fake_run(config, workdir, **kwargs):
        raise DataError("qnli: GLUE QNLI has no train split here")

    monkeypatch.setattr(gpt1_jax.finetune, "run", fake_run)
    run = _runs(tmp_path, 1)[0]
    with pytest.raises(harness.RunFailed, match=rf"^{run.workdir}: DataError: qnli: GLUE QNLI has no train split here$"):
        harness.record_of(harness.make(run, harness.Records(tmp_path), harness.finetune_record))
    assert harness.record_of(None) is None  # stopped at a checkpoint: the sweep stops and resumes


def test_no_network_for_glue_stops_the_sweep_at_its_first_run(tmp_path, monkeypatch):
    """Offline without --data-dir, glue_table went through all 81 runs (3 min 12 s), each failing on the same
    download: the first one's line now ends the command."""
    from gpt1_jax.data.glue import GlueDownloadError

    started = []

    def fake_run(config, workdir, **kwargs):
        started.append(config.seed)
        raise GlueDownloadError("cannot reach dl.fbaipublicfiles.com to download GLUE: use --data-dir DIR")

    monkeypatch.setattr(gpt1_jax.finetune, "run", fake_run)
    with pytest.raises(GlueDownloadError, match="use --data-dir"):
        harness.sweep(_runs(tmp_path, 3), harness.Records(tmp_path), harness.finetune_record)
    assert started == [0]


def test_a_run_stopped_at_a_checkpoint_stops_the_sweep_without_a_record(tmp_path, monkeypatch, capsys):
    started = []

    def fake_run(config, workdir, **kwargs):
        started.append(config.seed)
        return Outcome("preempted", 3)

    monkeypatch.setattr(gpt1_jax.finetune, "run", fake_run)
    assert harness.sweep(_runs(tmp_path, 3), harness.Records(tmp_path, tmp_path / "kept"), _record) is None
    assert started == [0] and not list(tmp_path.rglob("*.json"))
    assert "stopped at step 3 (SIGTERM); the same command resumes" in capsys.readouterr().err


def test_a_stop_with_a_runs_last_step_keeps_its_record_and_stops_the_sweep(tmp_path, monkeypatch, capsys):
    """In several processes JAX can place the agreed stop on a run's last step: that run finished, and the sweep
    went on to its end with the stop forgotten (tests/e2e/test_multihost.py)."""
    started = []

    def fake_run(config, workdir, **kwargs):
        started.append(config.seed)
        return Outcome("finished", 3, stop_requested=True)

    monkeypatch.setattr(gpt1_jax.finetune, "run", fake_run)
    assert harness.sweep(_runs(tmp_path, 3), harness.Records(tmp_path, tmp_path / "kept"), _record) is None
    assert started == [0] and len(list((tmp_path / "kept").rglob("*.json"))) == 1
    assert "finished, then stopped (SIGTERM or Ctrl-C); the same command resumes" in capsys.readouterr().err


def test_a_record_made_with_other_settings_is_not_this_runs(tmp_path, monkeypatch):
    """A --quick pipeline's records under the same --out counted as the laptop budget's, and a glue_table rerun with
    --set optim.lr=... or another --init reported the old runs' scores under the new settings."""
    monkeypatch.setattr(gpt1_jax.finetune, "run", lambda config, workdir, **k: Outcome("finished", 3))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "README.md").write_text("card")

    def run(init=str(model), **changes):
        config = FinetuneConfig(task="sst2")
        return harness.Run(dataclasses.replace(config, **changes), tmp_path / "out" / "sst2" / "seed0", init)

    records = harness.Records(tmp_path / "out")
    assert harness.make(run(), records, _record).seconds > 0
    assert harness.make(run(), records, _record).seconds == 0  # done before
    # a rebuild from kept records (experiments.regenerate: no --data-dir, train=False) reads them as they are:
    # their digest names the GLUE folder of the machine that made them
    made = harness.make(run(), records, _record).record
    rebuild = harness.Records(tmp_path / "out", train=False)
    elsewhere = dataclasses.replace(run(), data_dir=str(tmp_path / "elsewhere"))
    assert harness.make(elsewhere, rebuild, _record).record == made

    with pytest.raises(ConfigError, match=r"seed0: finished with other settings than this sweep's \(its config, the "
                                         r"model its --init holds or its data differ\): give this sweep its own --out"):
        harness.make(run(optim=dataclasses.replace(FinetuneConfig().optim, lr=1e-3)), records, _record)
    with pytest.raises(ConfigError, match="finished with other settings"):
        harness.make(run(init="none"), records, _record)

    # what does not decide the score does not count: how it runs, the model card, the model folder's path
    before = harness.settings(run())
    moved = tmp_path / "moved"
    model.rename(moved)
    (moved / "README.md").write_text("a rewritten card")
    same = run(init=str(moved), model=dataclasses.replace(FinetuneConfig().model, dtype="bfloat16"),
               eval_batch_size=64, checkpoint_every=5)
    assert harness.settings(same) == before
    (moved / "model.safetensors").write_bytes(b"other weights")
    assert harness.settings(run(init=str(moved))) != before

    # the task's GLUE files count by content: a copy elsewhere is the same data, other rows are not
    for name, text in (("a", "row 1\n"), ("b", "row 1\n"), ("c", "row 2\n")):
        (tmp_path / name / "SST-2").mkdir(parents=True)
        (tmp_path / name / "SST-2" / "train.tsv").write_text(text)
    on = {name: harness.settings(dataclasses.replace(run(init="none"), data_dir=str(tmp_path / name))) for name in "abc"}
    assert on["a"] == on["b"] != on["c"] and on["a"] != harness.settings(run(init="none"))

    # a record from before settings were kept is taken as it is
    record = tmp_path / "out" / "sst2" / "seed0" / "record.json"
    record.write_text(json.dumps({"seed": 0, "status": "finished"}))
    assert harness.make(run(init="none"), records, _record).record == {"seed": 0, "status": "finished"}


def test_an_experiments_command_line_ends_a_project_or_os_error_in_one_line(tmp_path, capsys, monkeypatch):
    """glue_table --tasks qqq, run_study --out FILE, ...: tracebacks before; now as `gpt1-jax`'s one line, status 2."""
    from gpt1_jax.errors import DEBUG_ENV
    from gpt1_jax.errors import ConfigError

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    (tmp_path / "a_file").write_text("")

    def bad_task():
        raise ConfigError("unknown task 'qqq'; known: cola, sst2")

    def out_is_a_file():
        (tmp_path / "a_file" / "pretrain").mkdir(parents=True)

    assert harness.main(bad_task, "glue_table") == 2
    assert capsys.readouterr().err == "glue_table: error: unknown task 'qqq'; known: cola, sst2\n"
    assert harness.main(out_is_a_file, "run_study") == 2
    assert capsys.readouterr().err == (f"run_study: error: cannot use {tmp_path}/a_file/pretrain: Not a directory; "
                                       f"{tmp_path}/a_file is a file, not a folder: choose another path or move the "
                                       "file out of the way\n")
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(ConfigError):
        harness.main(bad_task, "glue_table")


def test_a_ctrl_c_that_stopped_a_run_is_said_once(capsys):
    """The loop's Interrupted says what it saved and how to resume: the study's last line read "run_study:
    interrupted: interrupted (Ctrl-C) at step 7: checkpoint saved; run the same command to resume; the same command
    resumes". A Ctrl-C outside a run keeps the generic line."""
    from gpt1_jax.errors import Interrupted

    def stopped_in_a_run():
        raise Interrupted("interrupted (Ctrl-C) at step 7: checkpoint saved; run the same command to resume", step=7)

    def stopped_between_runs():
        raise KeyboardInterrupt

    assert harness.main(stopped_in_a_run, "run_study") == 130
    assert capsys.readouterr().err == ("run_study: interrupted (Ctrl-C) at step 7: checkpoint saved; run the same "
                                       "command to resume\n")
    assert harness.main(stopped_between_runs, "run_study") == 130
    assert capsys.readouterr().err == "run_study: interrupted; the same command resumes\n"


def test_a_ctrl_c_passed_on_after_the_last_run_says_that_nothing_stopped(capsys, monkeypatch):
    """Multi-process: a Ctrl-C after the last run's last step is passed on to JAX with the line "every process stops
    at the step they agree on", and no loop was left to agree on one: the study completed (exit 0) and said nothing."""
    import gpt1_jax.interrupt

    assert harness.main(lambda: 0, "run_study") == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(gpt1_jax.interrupt, "_passed_to_jax", [True])  # as pass_ctrl_c_to_jax leaves it
    assert harness.main(lambda: 0, "run_study") == 0
    assert capsys.readouterr().err == ("run_study: the Ctrl-C came after the last run's last step: nothing was left "
                                       "to stop\n")


@pytest.mark.parametrize("parse_args, argv, message", [
    ("experiments.optimizers.run_study", ["--bogus"], "unrecognized arguments: --bogus"),
    ("experiments.optimizers.run_study", ["--out", "o", "--bogus", "pretrain"], "unrecognized arguments: --bogus"),
    ("experiments.glue.glue_table", ["--bogus=1"], "unrecognized arguments: --bogus=1"),
    ("experiments.paper.run", ["--stages", "pretrain", "--bogus"], "unrecognized arguments: --bogus"),
    ("experiments.optimizers.run_study", [], "the following arguments are required: study, --out"),
])
def test_an_unknown_flag_of_an_experiment_is_named_before_a_missing_one(parse_args, argv, message, capsys):
    """`python -m experiments.optimizers.run_study --bogus` said only 'the following arguments are required: study,
    --out' (argparse checks those first), under a usage block; now one line naming --bogus, as `gpt1-jax`'s."""
    module = importlib.import_module(parse_args)
    for _ in range(2):  # the required flags are required again after the look for unknown ones
        with pytest.raises(SystemExit) as e:
            module.parse_args(argv)
        err = capsys.readouterr().err.splitlines()
        assert e.value.code == 2 and len(err) == 1 and f": error: {message} (see " in err[0], err


def test_every_experiment_script_parses_with_the_harness_parser():
    """A script built on argparse.ArgumentParser would hide an unknown flag behind a missing one again."""
    scripts = Path(harness.__file__).parent.rglob("*.py")
    assert not [str(p) for p in scripts if "argparse.ArgumentParser(" in p.read_text()]


@pytest.mark.parametrize("module, scripts, readme", [
    ("experiments.paper.release", "check_run, cost, run", "experiments/paper/README.md"),
    ("experiments.harness", "regenerate", "README.md"),
])
def test_a_part_run_as_a_script_is_refused_in_one_line(module, scripts, readme):
    """`python -m experiments.paper.release` (a stage `experiments.paper.run` imports) ran nothing and exited 0."""
    done = subprocess.run([sys.executable, "-m", module, "--out", "x"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [f"python -m {module}: not a script, a part the scripts import; the scripts "
                                        f"beside it: {scripts} (see {readme})"]
    assert not (ROOT / "x").exists()
    script = subprocess.run([sys.executable, "-m", "experiments.paper.cost", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert script.returncode == 0 and script.stdout.startswith("usage: ")


def test_a_script_run_by_its_path_says_how_to_run_it_in_one_line(tmp_path):
    """`python experiments/paper/run.py` ended in a ModuleNotFoundError traceback: a script runs in its package, which
    `python -m` from the repository root gives (making the path form work would take a sys.path edit)."""
    scripts = sorted(p for p in (ROOT / "experiments").rglob("*.py")
                     if p.name != "__init__.py" and 'if __name__ == "__main__"' in p.read_text())
    assert len(scripts) >= 15
    for path in scripts:
        done = subprocess.run([sys.executable, str(path), "--help"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        assert (done.returncode, done.stdout) == (2, ""), (path, done.stderr[-2000:])
        assert done.stderr.splitlines() == [f"{path.name}: error: run it from the repository root as: python -m "
                                            f"{module} ..."]
    assert subprocess.run([sys.executable, "-m", "experiments.paper.run", "--help"], cwd=ROOT, capture_output=True,
                          timeout=60).returncode == 0


@pytest.mark.parametrize("module, argv", [
    ("experiments.glue.glue_table", ["--init", "none", "--out", "o"]),
    ("experiments.glue.race_table", ["--init", "none", "--out", "o", "--data", "d"]),
    ("experiments.paper.run", ["--stages", "pretrain"]),
])
def test_the_scripts_that_only_score_split_the_cpu_with_one_flag(module, argv, capsys, tmp_path, monkeypatch):
    """The GLUE and RACE tables ran on one device only, where the paper pipeline took --cpu-devices (2: 12-16% faster
    steps on the AVX2 kind): the three now share the flag, its bounds and its default."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    parse = importlib.import_module(module).parse_args
    assert parse(argv).cpu_devices == 1 and parse([*argv, "--cpu-devices", "2"]).cpu_devices == 2
    for bad, said in (("0", "must be >= 1, got 0"), ("two", "expected a whole number, got 'two'")):
        with pytest.raises(SystemExit) as e:
            parse([*argv, "--cpu-devices", bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and f"error: argument --cpu-devices: {said}" in err[0], err
    with pytest.raises(SystemExit):
        importlib.import_module("experiments.optimizers.run_study").parse_args(["pretrain", "--out", "o",
                                                                               "--cpu-devices", "2"])
    assert "unrecognized arguments: --cpu-devices 2" in capsys.readouterr().err  # its tables compare seconds


@pytest.mark.parametrize("module, argv", [
    ("experiments.glue.glue_table", ["--init", "none", "--out", "o"]),
    ("experiments.glue.race_table", ["--init", "none", "--out", "o", "--data", "d"]),
    ("experiments.optimizers.run_study", ["pretrain", "--out", "o"]),
])
def test_every_experiment_takes_its_seeds_in_one_syntax(module, argv, capsys):
    """glue_table and race_table took `--seeds 0 1 2`, run_study and check_run `--seeds 0,1,2` (as every other list
    flag: --tasks, --ablations, --optimizers): now all four take the comma-separated form (harness.seed_list), and
    say what is wrong with any other in one line."""
    parse = importlib.import_module(module).parse_args
    for seeds, said in (("0 1", "argument --seeds: expected comma-separated whole numbers, got '0 1'"),
                        ("-1", "argument --seeds: expected comma-separated whole numbers, got '-1'"),
                        ("2,2", "argument --seeds: a seed is given twice in '2,2'")):
        with pytest.raises(SystemExit) as e:
            parse([*argv, "--seeds", seeds])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and f": error: {said} (see " in err[0], err
    with pytest.raises(SystemExit):
        parse([*argv, "--seeds", "0", "1"])
    assert "unrecognized arguments: 1 (see " in capsys.readouterr().err


@pytest.mark.parametrize("module, argv, held", [
    ("experiments.glue.glue_table", ["--init", "none", "--data-dir", "{tmp}", "--out", "{tmp}/out"], "out"),
    ("experiments.glue.race_table", ["--init", "none", "--data", "{tmp}", "--out", "{tmp}/out"], "out"),
    ("experiments.optimizers.run_study", ["pretrain", "--quick", "--out", "{tmp}/out"], "out/pretrain"),
    ("experiments.paper.run", ["--quick", "--stages", "pretrain", "--corpus", "default", "--out", "{tmp}/out"], "out"),
])
def test_a_second_sweep_on_one_out_is_refused_in_one_line(module, argv, held, tmp_path, capsys):
    """Each run's folder had its own lock, and no sweep held its --out: a second quick glue_table on one --out
    skipped the run the first was training as a failure and wrote table.md from the records so far (one seed's
    score), over the first one's when it ended last. Now the second is refused before it reads or writes a thing."""
    folder = tmp_path / held
    _glue_files(tmp_path, "RTE")  # a --data-dir without a task is refused before the lock (glue_table.task_list)
    with harness.one_sweep(folder, "the first"):
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        try:
            status = importlib.import_module(module).main([a.replace("{tmp}", str(tmp_path)) for a in argv])
        except WorkdirError as e:  # harness.main makes it one line and exit status 2
            status, said = 2, str(e)
        else:
            said = capsys.readouterr().err
        assert status == 2 and (f"{folder} is in use by pid {os.getpid()} on " in said
                                and "(a sweep running there now): wait for it to end, or stop it; " in said
                                and " would write the same runs' records and tables" in said), said
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not folder.exists()  # made for the lock, and left as it was found


def _glue_files(root: Path, *dirnames: str) -> Path:
    """A GLUE TSV distribution with these tasks' train and dev files (empty: nothing here reads them)."""
    for name in dirnames:
        (root / name).mkdir(parents=True, exist_ok=True)
        for split in ("train.tsv", "dev.tsv"):
            (root / name / split).write_text("")
    return root


def _run_folder(path: Path, kind: str = "pretrain") -> Path:
    """What gpt1_jax.workdir.read and weights.detect_format take for a run folder, nothing trained in it."""
    (path / "checkpoints").mkdir(parents=True)
    (path / "config.yaml").write_text("")
    task = {"task": "rte", "init": "none"} if kind == "finetune" else {}
    (path / "run.json").write_text(json.dumps({"format": 1, "kind": kind, **task}))
    return path


OUT_SCRIPTS = [
    ("experiments.glue.glue_table", ["--quick", "--seeds", "0", "--tasks", "rte", "--data-dir", "{tmp}/glue"]),
    ("experiments.glue.race_table", ["--quick", "--seeds", "0", "--data", "{tmp}/glue"]),
    ("experiments.optimizers.run_study", ["finetune", "--quick", "--optimizers", "adamw", "--data-dir", "{tmp}/glue"]),
]


@pytest.mark.parametrize("module, argv", OUT_SCRIPTS)
@pytest.mark.parametrize("out, init, said", [
    ("base", "base", "--out {tmp}/base is the --init source: the sweep would write its runs and tables into the model "
                     "it starts from; choose another --out"),
    ("other", "base", "--out {tmp}/other holds a pre-training run: the sweep would write its runs and tables into it"),
    ("ft", "base", "--out {tmp}/ft holds a fine-tuning run of rte from none: the sweep would write its runs and "),
])
def test_an_out_that_is_a_run_folder_or_the_init_source_is_refused_before_a_write(module, argv, out, init, said,
                                                                                 tmp_path, monkeypatch):
    """`glue_table --init RUN --out RUN` exited 0 with full/, table.md and table.png in the pre-training run's
    folder (the same with a fine-tuning run's folder as --out); race_table and run_study the same. Now one line
    (harness.check_out, in one_sweep) before a thing is written."""
    monkeypatch.setattr(gpt1_jax.finetune, "run", lambda *a, **k: pytest.fail("a run started"))
    _glue_files(tmp_path / "glue", "RTE")
    _run_folder(tmp_path / "base"), _run_folder(tmp_path / "other"), _run_folder(tmp_path / "ft", "finetune")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    flags = [*argv, "--init", f"{{tmp}}/{init}", "--out", f"{{tmp}}/{out}"]
    with pytest.raises(WorkdirError) as e:  # harness.main makes it one line and exit status 2
        importlib.import_module(module).main([a.replace("{tmp}", str(tmp_path)) for a in flags])
    assert str(e.value).startswith(said.replace("{tmp}", str(tmp_path))), str(e.value)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("module, argv", [
    ("experiments.glue.glue_table", ["--init", "none", "--out", "o"]),
    ("experiments.glue.race_table", ["--init", "none", "--out", "o", "--data", "."]),
])
@pytest.mark.parametrize("sets, said", [
    (["optim.total_steps=5"], "--set: optim.total_steps is derived in fine-tuning: total_steps from --epochs and the "
                              "training examples, warmup_steps from warmup_fraction (the paper's 0.2%): set those "
                              "instead"),
    (["optim={warmup_steps: 3}"], "--set: optim.warmup_steps is derived in fine-tuning: "),
    (["task=cola"], "--set: task is set for each run by "),
    (["lm_coef=0.25", "seed=4"], "--set: seed is set for each run by --seeds, not by --set"),
])
def test_a_set_that_no_run_would_keep_is_one_line(module, argv, sets, said, capsys):
    """glue_table ran with `--set optim.total_steps=5` (which `gpt1-jax finetune` refuses: fine-tuning derives it)
    and `--set task=cola` / `seed=4` (each run's own from --tasks, --seeds) as if they were not there."""
    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).parse_args([*argv, *[f for s in sets for f in ("--set", s)]])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and f": error: {said}" in err[0], err
    args = importlib.import_module(module).parse_args([*argv, "--set", "lm_coef=0.25"])  # one a run keeps: taken
    assert args.config.lm_coef == 0.25


@pytest.mark.parametrize("module, argv, flag, kind", [
    ("experiments.glue.glue_table", ["--init", "none", "--out", "o"], "--tasks", "task"),
    ("experiments.glue.glue_table", ["--init", "none", "--out", "o"], "--ablations", "ablation"),
    ("experiments.glue.race_table", ["--init", "none", "--out", "o", "--data", "."], "--ablations", "ablation"),
    ("experiments.optimizers.run_study", ["pretrain", "--out", "o"], "--optimizers", "optimizer"),
    ("experiments.optimizers.run_study", ["finetune", "--out", "o", "--init", "."], "--tasks", "task"),
])
def test_an_empty_list_flag_is_one_line(module, argv, flag, kind, capsys):
    """`run_study --optimizers ''` ran every optimizer (55 runs), `glue_table --tasks ''` every task: an empty list
    read as none given. Every list flag now parses with harness.name_list: no empty name, none twice."""
    parse = importlib.import_module(module).parse_args
    for value, said in (("", f"expected comma-separated {kind} names, got ''"),
                        ("a,", f"expected comma-separated {kind} names, got 'a,'"),
                        ("a,a", f"a {kind} is given twice in 'a,a'")):
        with pytest.raises(SystemExit) as e:
            parse([*argv, flag, value])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and f": error: argument {flag}: {said} (see " in err[0], err


@pytest.mark.parametrize("module, argv, said", [
    ("experiments.glue.glue_table", ["--init", "{tmp}/notmodel", "--data-dir", "{tmp}/glue"],
     "--init {tmp}/notmodel: not a GPT-1 checkpoint (expected "),
    ("experiments.glue.glue_table", ["--init", "scratch:{tmp}/notmodel", "--data-dir", "{tmp}/glue"],
     "--init {tmp}/notmodel: not a GPT-1 checkpoint (expected "),
    ("experiments.glue.race_table", ["--init", "{tmp}/notmodel", "--data", "{tmp}/glue"],
     "--init {tmp}/notmodel: not a GPT-1 checkpoint (expected "),
    ("experiments.glue.glue_table", ["--init", "none", "--data-dir", "{tmp}/notmodel"],
     "--data-dir {tmp}/notmodel: no GLUE task's train and dev files in it (GLUE's TSV distribution: "),
    ("experiments.glue.glue_table", ["--init", "none", "--data-dir", "{tmp}/glue", "--tasks", "rte,CoLA"],
     "--data-dir {tmp}/glue: no train and dev files of cola in it (GLUE's TSV distribution: "),
    ("experiments.glue.glue_table", ["--init", "none", "--data-dir", "{tmp}/glue", "--tasks", "rte,race"],
     "--tasks: race is not a GLUE task (race_table makes RACE's table)"),
    ("experiments.glue.glue_table", ["--init", "none", "--data-dir", "{tmp}/glue", "--tasks", "sst3"],
     "--tasks: unknown task 'sst3'; known: cola, "),
])
def test_a_bad_init_or_data_is_one_line_before_the_first_run(module, argv, said, tmp_path, monkeypatch, capsys):
    """A folder that holds no model as --init, or a --data-dir without the tasks: each run failed on it in turn, then
    a table of failures (or, without a task, an empty table and exit 0) was written. Now one line, exit 2, nothing
    written."""
    monkeypatch.setattr(gpt1_jax.finetune, "run", lambda *a, **k: pytest.fail("a run started"))
    _glue_files(tmp_path / "glue", "RTE")
    (tmp_path / "notmodel").mkdir()
    (tmp_path / "notmodel" / "notes.txt").write_text("")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    flags = [*argv, "--quick", "--seeds", "0,1", "--out", "{tmp}/out"]
    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main([a.replace("{tmp}", str(tmp_path)) for a in flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and f": error: {said.replace('{tmp}', str(tmp_path))}" in err[0], err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_every_script_names_itself_as_the_command_that_runs_it():
    """`python -m experiments.paper.run --bogus` said "run.py: error: ... (see run.py --help)", and the scripts named
    themselves four ways: each one's --help, argparse errors and harness.main's lines now say `python -m MODULE`."""
    root = Path(harness.__file__).resolve().parents[1]
    scripts = [p for p in sorted((root / "experiments").rglob("*.py"))
               if p.name != "__init__.py" and 'if __name__ == "__main__"' in p.read_text()]
    assert len(scripts) >= 17
    for path in scripts:
        text = path.read_text()
        assert "PROG = harness.prog(__spec__.name)" in text, path
        assert all("prog=PROG" in call for call in re.findall(r"harness\.parser\([^\n]*", text)), path
        calls = set(re.findall(r"harness\.main\([^)]*\)", text))
        # the scripts whose runs train for hours keep glibc's heap (harness.main `trains`); the others do not ask
        trains = path.relative_to(root).as_posix() in TRAINING_SCRIPTS
        if trains:
            assert calls == {"harness.main(main, PROG, trains=True)"}, path
        else:
            assert calls <= {"harness.main(main, PROG)"}, path
    assert harness.prog("experiments.paper.run") == "python -m experiments.paper.run"


TRAINING_SCRIPTS = {"experiments/paper/run.py", "experiments/paper/check_run.py", "experiments/optimizers/run_study.py",
                    "experiments/glue/glue_table.py", "experiments/glue/race_table.py"}
