"""The one command line: every verb that runs a model takes the shared flags; a flag that sets config fields
is declared once and says which in --help; --seed means one thing everywhere; evaluate and sample read the
same model sources; a project error ends as one line (exit 2, or 1 for a diverged run), anything else keeps
its traceback. One model runs: evaluate on the committed 5M release, seconds."""

import json
import re
import shutil
from pathlib import Path
import errno  # noqa: E402
import os  # noqa: E402

import pytest

from gpt1_jax import cli, integrity
from gpt1_jax.config import (OPTIMIZER_NAMES, SECOND_MOMENT_OPTIMIZERS, DataConfig, FinetuneConfig, ModelConfig,
                             OptimConfig, PretrainConfig, check_storage, resolve)
from gpt1_jax.errors import CheckpointFormatError, DataError, DivergenceError
from tests.support.cli import _one_error_line
from tests.support.killed import gone_pid
from tests.support.weights import SMALL, write_hf_dir


ROOT = Path(__file__).resolve().parents[2]


RELEASE = ROOT / "experiments" / "paper" / "release"


SHARED = ["--config", "tiny", "--set", "a=1", "--set", "b.c=2", "--mesh", "fsdp=2", "--simulate-devices", "2"]


REQUIRED = {"pretrain": ["--workdir", "w"], "finetune": ["--task", "cola", "--init", "none", "--workdir", "w"],
            "evaluate": ["--workdir", "w"], "sample": ["--workdir", "w"], "bench": [], "plan": [],
            "predict": ["--workdir", "w", "input.tsv"]}


def test_every_model_verb_takes_the_shared_flags():
    assert {name for name, verb in cli.VERBS.items() if verb.runs_model} == set(REQUIRED)
    parser = cli.build_parser()
    for verb, required in REQUIRED.items():
        args = parser.parse_args([verb, *required, *SHARED])
        assert (args.config, args.set, args.mesh, args.simulate_devices) == \
            ("tiny", ["a=1", "b.c=2"], "fsdp=2", 2), verb
        assert args.coordinator is None  # and the multi-process flags, on every verb
    with pytest.raises(SystemExit):  # convert runs no model
        parser.parse_args(["convert", "src", "dst", "--mesh", "fsdp=2"])


def test_flags_then_set_in_that_order():
    args = cli.build_parser().parse_args(["pretrain", "--workdir", "w", "--seed", "5", "--steps", "9",
                                          "--set", "seed=6"])
    assert cli._overrides(args, PretrainConfig) == ["steps=9", "seed=5", "data.seed=5", "seed=6"]
    for text in ("off", "1e3", "null"):  # YAML would read these as a bool, a number, None: a --data is a path
        args = cli.build_parser().parse_args(["pretrain", "--workdir", "w", "--data", text])
        assert resolve(PretrainConfig, None, overrides=cli._overrides(args, PretrainConfig)).data.source == text


def _subparsers() -> dict:
    parser = cli.build_parser()
    return next(a for a in parser._actions if a.dest == "verb").choices


CONFIG_OF = {"pretrain": PretrainConfig, "plan": PretrainConfig, "bench": PretrainConfig, "evaluate": PretrainConfig,
             "finetune": FinetuneConfig, "tokenize": DataConfig, "convert": ModelConfig}


POSITIONAL = {"tokenize": ["--data", "d", "--tokenizer", "t"], "convert": ["src", "dst"]}


def test_every_config_flag_says_in_help_which_fields_it_sets_and_sets_exactly_those():
    """One table: a verb's flag that sets config fields names them all in --help, and `_overrides` sets them
    and nothing else (bench --lr no longer switches the schedule behind the user's back)."""
    checked = 0
    for verb, sub in _subparsers().items():
        for name in sub.get_default("config_flags") or ():
            fields = cli.CONFIG_FLAGS[name].fields[CONFIG_OF[verb]]
            action = sub._option_string_actions[name]
            assert action.help.endswith(f"[sets {', '.join(fields)}]"), (verb, name, action.help)
            value = str(action.choices[0]) if action.choices else "7"
            args = sub.parse_args(REQUIRED.get(verb, POSITIONAL.get(verb, [])) + [name, value])
            given = [s for s in cli._overrides(args, CONFIG_OF[verb]) if s.split("=")[0] in fields]
            assert [s.split("=")[0] for s in given] == list(fields), (verb, name)
            checked += 1
    assert checked >= 30
    assert cli.CONFIG_FLAGS["--lr"].fields[PretrainConfig] == ("optim.lr",)


def test_pretrain_takes_the_optimizer_flags_bench_and_finetune_take_each_as_its_set_would():
    """`pretrain --optim adamw` was "unrecognized arguments" where bench and finetune took it. Each flag sets its
    one field, as its --set does, and nothing else (bench --lr once also made the schedule constant)."""
    parser = cli.build_parser()
    flags = {"--optim": ("optim.name", "lion"), "--lr": ("optim.lr", "3e-4"),
             "--schedule": ("optim.schedule", "constant"), "--accum-steps": ("accum_steps", "2")}
    for flag, (field, value) in flags.items():
        args = parser.parse_args(["pretrain", "--workdir", "w", flag, value])
        by_flag = resolve(PretrainConfig, "tiny", overrides=cli._overrides(args, PretrainConfig))
        assert by_flag == resolve(PretrainConfig, "tiny", overrides=[f"{field}={value}"]), flag
        assert by_flag != resolve(PretrainConfig, "tiny"), flag
    every = parser.parse_args(["pretrain", "--workdir", "w", *(x for f, (_, v) in flags.items() for x in (f, v))])
    assert resolve(PretrainConfig, "tiny", overrides=cli._overrides(every, PretrainConfig)) == resolve(
        PretrainConfig, "tiny", overrides=[f"{field}={value}" for field, value in flags.values()])
    with pytest.raises(SystemExit):  # a dtype is not an optimizer setting: --set model.dtype, as before
        parser.parse_args(["pretrain", "--workdir", "w", "--dtype", "bfloat16"])


def test_seed_means_every_random_choice_on_every_verb_that_takes_it():
    """pretrain and bench: init, dropout and the data order (seed and data.seed); finetune: seed (init,
    dropout, order, its training subset); sample: its draws. Never the held-out split."""
    parser = cli.build_parser()
    pretrain = resolve(PretrainConfig, "tiny", overrides=cli._overrides(
        parser.parse_args(["pretrain", "--workdir", "w", "--seed", "5"]), PretrainConfig))
    assert (pretrain.seed, pretrain.data.seed, pretrain.data.split_seed) == (5, 5, 0)
    bench = parser.parse_args(["bench", "--seed", "5"])
    assert cli._overrides(bench, PretrainConfig) == ["seed=5", "data.seed=5"]
    finetune = resolve(FinetuneConfig, "tiny", overrides=cli._overrides(
        parser.parse_args(["finetune", *REQUIRED["finetune"], "--seed", "5"]), FinetuneConfig))
    assert finetune.seed == 5 and finetune.max_eval_examples == 0
    assert parser.parse_args(["sample", "--init", "m", "--seed", "5"]).seed == 5
    for verb in ("evaluate", "plan"):  # nothing random to seed: no --seed
        with pytest.raises(SystemExit):
            parser.parse_args([verb, *REQUIRED[verb], "--seed", "5"])
    helps = {verb: next(a.help for a in sub._actions if "--seed" in a.option_strings)
             for verb, sub in _subparsers().items() if "--seed" in sub._option_string_actions}
    assert set(helps) == {"pretrain", "finetune", "bench", "sample"}
    assert all(h.startswith(cli.SEED_HELP) for h in helps.values())
    assert helps["pretrain"].endswith("[sets seed, data.seed]") and helps["finetune"].endswith("[sets seed]")


def test_the_cli_docs_list_the_flag_table():
    """docs/cli.md's table is CONFIG_FLAGS: a row per flag and config class."""
    docs = (ROOT / "docs" / "cli.md").read_text()
    rows = set(re.findall(r"^\| `(--[a-z-]+)` \| (\w+) \| ([^|]+) \|", docs, re.M))
    expected = {(flag, c.__name__, ", ".join(f"`{f}`" for f in fields))
                for flag, spec in cli.CONFIG_FLAGS.items() for c, fields in spec.fields.items()}
    assert {(f, c, v.strip()) for f, c, v in rows} == expected


@pytest.fixture
def failing_bench(monkeypatch):
    """`gpt1-jax bench` whose library call raises the given exception (after the real flag handling)."""
    from gpt1_jax import bench

    def fail_with(error):
        def run(config, **kw):
            raise error
        monkeypatch.setattr(bench, "run", run)
        return ["bench", "--config", "tiny"]
    return fail_with


@pytest.mark.parametrize("error, status", [
    (DataError("corpus.txt: not UTF-8 text"), 2),
    (CheckpointFormatError("model.safetensors is truncated"), 2),
    (FileNotFoundError("no such directory: runs/x"), 2),
    (DivergenceError("loss is nan at step 7; last good checkpoint: step 6", step=7, loss=float("nan")), 1),
])
def test_a_project_error_is_one_line(failing_bench, capsys, monkeypatch, error, status):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(failing_bench(error)) == status
    assert capsys.readouterr().err.splitlines() == [f"gpt1-jax bench: error: {error}"]


def test_a_bug_keeps_its_traceback(failing_bench, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    for bug in (RuntimeError("a bug"), ValueError("a plain ValueError is a bug too"), KeyError("params")):
        with pytest.raises(type(bug)):
            cli.main(failing_bench(bug))


def test_debug_env_shows_the_traceback_of_a_project_error(failing_bench, monkeypatch):
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(DataError):
        cli.main(failing_bench(DataError("bad data")))


@pytest.mark.parametrize("argv, message", [
    (["evaluate", "--workdir", "w", "--mesh", "data=2"], "--mesh does not apply to evaluate"),
    (["evaluate", "--workdir", "w", "--config", "tiny"], "--config does not apply to evaluate"),
    (["sample", "--workdir", "w", "--mesh", "data=2"], "--mesh does not apply to sample"),
    (["sample", "--init", str(RELEASE), "--set", "seed=2"], "--set seed=2 does not apply to sample"),
    (["evaluate", "--init", str(RELEASE)], f"--init {RELEASE} is not a pre-training run, so it has no validation "
                                           "split of its own: pass --data"),
    (["evaluate", "--workdir", str(RELEASE), "--data", "x"], f"{RELEASE} is not a pre-training workdir"),
    (["evaluate", "--init", str(RELEASE), "--data", "x", "--step", "3"], f"{RELEASE}: step=3 only applies to a run"),
    (["evaluate", "--workdir", "no/such/run"], "no/such/run does not exist: give a pre-training run's workdir"),
    (["evaluate", "--init", "no/such/model"], "no/such/model: no such checkpoint directory"),  # not "pass --data"
    (["verify", "--workdir", "no/such/run"], "no/such/run does not exist: give a run's workdir"),
])
def test_a_flag_a_verb_or_its_source_cannot_honour_is_one_line(capsys, argv, message):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"gpt1-jax {argv[0]}: error: {message}")


def test_a_verb_s_help_lists_only_the_shared_flags_it_honours(capsys):
    """predict's --help listed --config, --set and --mesh, then refused each one; a refused flag is now kept out of
    the verb's help (the others' keep it) and still answers with the reason, before any process start-up."""
    subs, refused = _subparsers(), 0
    for verb, spec in cli.VERBS.items():
        shown = subs[verb].format_help()
        for flag, reason in spec.refuses.items():
            option = "--" + flag.replace("_", "-")
            assert f"{option} " not in shown, (verb, option)
            value = {"set": "model.dtype=bfloat16", "mesh": "data=1", "config": "tiny"}[flag]
            argv = [verb, *REQUIRED[verb], option, value]
            assert cli.main(argv) == 2
            shown_value = f" {value}" if flag == "set" else ""
            assert capsys.readouterr().err.splitlines() == [
                f"gpt1-jax {verb}: error: {option}{shown_value} does not apply to {verb}: {reason}"]
            refused += 1
    assert refused == 5 and "--mesh " in subs["pretrain"].format_help()
    assert {v for v, spec in cli.VERBS.items() if spec.refuses} == {"evaluate", "sample", "predict"}


def test_workdir_that_is_a_file_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    workdir = tmp_path / "run"
    workdir.write_text("not a run\n")
    status = cli.main(["pretrain", "--config", "tiny", "--data", "default", "--workdir", str(workdir),
                       "--set", f"data.cache_dir={tmp_path / 'cache'}"])
    line = _one_error_line(capsys, "pretrain")
    assert status == 2 and str(workdir) in line
    assert workdir.read_text() == "not a run\n" and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_model_vocab_size_on_pretrain_is_refused_not_silently_replaced(tmp_path, capsys, monkeypatch):
    """The run takes its tokenizer's size; a --set model.vocab_size was dropped without a word."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    status = cli.main(["pretrain", "--config", "tiny", "--workdir", str(tmp_path / "run"), "--set", "model.vocab_size=300",
                       "--set", f"data.cache_dir={tmp_path / 'cache'}"])
    assert status == 2 and "set data.vocab_size for the size of the BPE" in _one_error_line(capsys, "pretrain")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_dry_run_needs_no_workdir_and_a_run_says_it_needs_one(tmp_path, capsys, monkeypatch):
    """--dry-run writes nothing, yet argparse required a --workdir for it (the README's command failed so)."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["pretrain", "--config", "tiny", "--dry-run", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["dry_run"] is True and report["num_params"] > 0 and not list(tmp_path.iterdir())
    assert cli.main(["pretrain", "--config", "tiny"]) == 2
    assert _one_error_line(capsys, "pretrain") == ("gpt1-jax pretrain: error: --workdir is required: the run's folder "
                                                   "(only --dry-run, which writes nothing, runs without one)")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders: no error to see")
def test_workdir_under_a_folder_without_write_permission_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        status = cli.main(["pretrain", "--config", "tiny", "--data", "default", "--workdir", str(locked / "run"),
                           "--set", f"data.cache_dir={tmp_path / 'cache'}"])
        line = _one_error_line(capsys, "pretrain")
    finally:
        locked.chmod(0o700)
    assert status == 2 and str(locked) in line
    assert not list(locked.iterdir()) and not (tmp_path / "cache").exists()


def test_convert_into_a_non_empty_folder_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    assert cli.main(["convert", str(tmp_path / "src"), str(out)]) == 2
    line = _one_error_line(capsys, "convert")
    assert line == (f"gpt1-jax convert: error: {out} is not empty; nothing was written: pass --overwrite to replace "
                    "what is in it, or pick an empty or new folder")
    assert [p.name for p in out.iterdir()] == ["precious.txt"] and (out / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert cli.main(["convert", str(out), str(out), "--overwrite"]) == 2  # onto its own source
    assert _one_error_line(capsys, "convert") == (f"gpt1-jax convert: error: {out} is the model converted, or holds it; "
                                                  "--overwrite would delete what is read: pick a new or empty folder")
    assert (out / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("argv, said", [
    (["{src}"], "DST is missing"),
    ([], "SRC and DST are missing"),
    (["--init", "{src}", "{out}", "other"], "other: a path too many"),
    (["--init", "{src}", "--out", "{out}", "other"], "other: a path too many"),
])
def test_convert_reads_init_and_writes_out_as_the_other_verbs_name_them(tmp_path, capsys, monkeypatch, argv, said):
    """`convert --init SRC --out DST` was "unrecognized arguments: --init --out": the flags sample, evaluate and
    finetune read a model with, and compare writes with. Either spelling, or both mixed; each path once."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    write_hf_dir(tmp_path / "src", SMALL)
    src, out = tmp_path / "src", tmp_path / "out"
    assert cli.main(["convert", "--init", str(src), "--to", "jax", "--out", str(out)]) == 0
    assert (out / "config.yaml").is_file()
    assert cli.main(["convert", str(src), "--out", str(tmp_path / "mixed")]) == 0
    assert (tmp_path / "mixed" / "config.json").is_file()
    capsys.readouterr()
    assert cli.main(["convert", *(a.format(src=src, out=tmp_path / "never") for a in argv)]) == 2
    assert _one_error_line(capsys, "convert") == (
        f"gpt1-jax convert: error: convert needs the model it reads and the folder it writes, once each: {said}; "
        "gpt1-jax convert SRC DST, or --init SRC --out DST")
    assert not (tmp_path / "never").exists()


def test_convert_takes_a_model_field_as_every_verb_spells_it_and_names_an_unknown_key(tmp_path, capsys, monkeypatch):
    """`--set model.dtype=...` was refused as "only run-time fields (dtype, ...) can be set, not 'model.dtype'", and
    `--set foo=1` as a field of the architecture."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    write_hf_dir(tmp_path / "src", SMALL)
    assert cli.main(["convert", str(tmp_path / "src"), str(tmp_path / "jax"), "--to", "jax",
                     "--set", "model.param_dtype=bfloat16"]) == 0
    assert "param_dtype: bfloat16" in (tmp_path / "jax" / "config.yaml").read_text()
    capsys.readouterr()
    assert cli.main(["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--set", "foo=1"]) == 2
    assert _one_error_line(capsys, "convert").startswith("gpt1-jax convert: error: unknown config key 'foo'; known: ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("make_error, expected", [
    (lambda d: PermissionError(errno.EACCES, "Permission denied", str(d / "runs" / "new")),
     "cannot create {d}/runs/new: Permission denied; pick a folder you can write to, or fix its permissions "
     "(or its parent's)"),
    (lambda d: OSError(errno.ENOSPC, "No space left on device", str(d / "cache" / "tokens.bin")),
     "cannot write {d}/cache/tokens.bin: No space left on device; free some space or choose a folder on another disk"),
    (lambda d: OSError(errno.EROFS, "Read-only file system", str(d / "ro" / "run")),
     "cannot write {d}/ro/run: Read-only file system; choose a folder on a writable disk"),
    (lambda d: FileExistsError(errno.EEXIST, "File exists", str(d / "a_file")),
     # the path it names, not a flag: the same words for `--workdir`, `convert --out` and an experiment's `--out`
     "cannot create the folder {d}/a_file: File exists; it is a file: choose another path or remove the file"),
    (lambda d: NotADirectoryError(errno.ENOTDIR, "Not a directory", str(d / "a_file" / "run")),
     "cannot use {d}/a_file/run: Not a directory; {d}/a_file is a file, not a folder: choose another path or move "
     "the file out of the way"),
    (lambda d: IsADirectoryError(errno.EISDIR, "Is a directory", str(d)),
     "cannot use {d}: Is a directory; it is a folder: give the path of a file"),
    (lambda d: FileNotFoundError(errno.ENOENT, "No such file or directory", str(d / "gone" / "run")),
     "cannot use {d}/gone/run: No such file or directory; check the path and the disk it is on"),  # not "[Errno 2] ..."
    (lambda d: OSError(errno.EMFILE, "Too many open files"),
     "Too many open files; raise the limit (ulimit -n) and run again"),
])
def test_an_os_error_is_one_line_naming_the_path_and_the_fix(failing_bench, capsys, monkeypatch, tmp_path,
                                                              make_error, expected):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    (tmp_path / "a_file").write_text("")
    assert cli.main(failing_bench(make_error(tmp_path))) == 2
    assert _one_error_line(capsys, "bench") == f"gpt1-jax bench: error: {expected.format(d=tmp_path)}"


def test_an_os_error_keeps_its_traceback_with_the_debug_env_and_a_failed_save_keeps_its_line(
        failing_bench, capsys, monkeypatch):
    from gpt1_jax.errors import CheckpointWriteError

    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(PermissionError):
        cli.main(failing_bench(PermissionError(errno.EACCES, "Permission denied", "/somewhere")))
    monkeypatch.delenv(cli.DEBUG_ENV)
    error = CheckpointWriteError("could not write checkpoint 8 in /x/checkpoints: No space left on device; the "
                                 "earlier checkpoints are untouched (steps 4)")
    assert cli.main(failing_bench(error)) == 2
    assert _one_error_line(capsys, "bench") == f"gpt1-jax bench: error: {error}"


def test_flags_are_never_abbreviated(capsys):
    """argparse's prefix matching once read `evaluate --init DIR` as `--init-timeout DIR` ("invalid int value")."""
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["evaluate", "--init", "m", "--data", "d", "--max-batch", "2"])
    # the line names the verb whose --help lists its flags (it said `see gpt1-jax --help`)
    assert e.value.code == 2 and capsys.readouterr().err == (
        "gpt1-jax evaluate: error: unrecognized arguments: --max-batch 2 (see gpt1-jax evaluate --help)\n")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["pretrain", "--workdir", "w", "--batch", "8"])  # --batch-size, spelled out


@pytest.mark.parametrize("argv, line", [
    (["--bogus", "pretrain"], "gpt1-jax pretrain: error: unrecognized arguments: --bogus (see gpt1-jax pretrain --help)"),
    (["pretrain", "--bogus"], "gpt1-jax pretrain: error: unrecognized arguments: --bogus (see gpt1-jax pretrain --help)"),
    (["sample", "--bogus=1"], "gpt1-jax sample: error: unrecognized arguments: --bogus=1 (see gpt1-jax sample --help)"),
    (["--bogus"], "gpt1-jax: error: unrecognized arguments: --bogus (see gpt1-jax --help)"),
    (["verify"], "gpt1-jax verify: error: the following arguments are required: --workdir (see gpt1-jax verify --help)"),
    (["evaluate"], "gpt1-jax evaluate: error: one of the arguments --workdir --init is required (see gpt1-jax evaluate --help)"),
])
def test_an_unknown_flag_is_named_before_a_missing_one(capsys, argv, line):
    """argparse checks a verb's required flags before it gives back the unknown ones: `gpt1-jax --bogus pretrain`
    said 'the following arguments are required: --workdir' and nothing of --bogus."""
    parser = cli.build_parser()
    for _ in range(2):  # the required flags are required again after the look for unknown ones
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 2 and capsys.readouterr().err.splitlines() == [line]


def test_evaluate_takes_any_model_source_as_sample_does(tmp_path, capsys):
    """`evaluate --init` reads what `sample --init` reads (here the committed release, a HF folder) through
    the same function, in windows of its whole context unless --seq-len says otherwise."""
    text = tmp_path / "text.txt"
    text.write_text("the module defines a class and a function that returns the value of the name\n" * 40)
    for verb in ("evaluate", "sample"):
        assert "--init" in _subparsers()[verb]._option_string_actions
    assert cli.main(["evaluate", "--init", str(RELEASE), "--data", str(text), "--seq-len", "32", "--max-batches", "1",
                     "--set", f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert "evaluate: 100%" in err and "1/1" in err  # the progress bar of its batches
    assert (result["source"], result["step"], result["seq_len"], result["split"]) == (str(RELEASE), None, 32,
                                                                                     "all windows")
    assert result["tokens"] == 16 * 32 and 0 < result["loss"] < 9.1  # 16: the default batch; ln(8192) = 9.01
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "text.txt"]  # nothing written beside the model
    # an attention this machine cannot run is one line, not jax's "cuDNN is not detected" traceback
    assert cli.main(["evaluate", "--init", str(RELEASE), "--data", str(text), "--set", "model.dtype=bfloat16",
                     "--set", "model.attention=cudnn"]) == 2
    assert capsys.readouterr().err.strip().endswith("model.attention='cudnn' needs an NVIDIA GPU, and this run's "
                                                    "devices are cpu; set attention=auto")


def test_evaluate_scores_a_text_shorter_than_a_batch_in_one_batch_of_its_own_size(tmp_path, capsys, monkeypatch):
    """A text of fewer windows than the batch was padded to the run's whole batch (a paragraph on 117M: 64 rows
    computed for 2); the same loss, over rows of the text only."""
    from gpt1_jax import evaluate
    from gpt1_jax.data.pipeline import BatchIterator

    rows = []

    class Seen(BatchIterator):
        def __init__(self, windows, order, global_batch_size, **kw):
            rows.append(global_batch_size)
            super().__init__(windows, order, global_batch_size, **kw)

    monkeypatch.setattr(evaluate, "BatchIterator", Seen)
    text = tmp_path / "text.txt"
    text.write_text("the module defines a class and a function that returns the value of the name\n" * 6)
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    scores = []
    for batch in ("16", "2"):
        assert cli.main(["evaluate", "--init", str(RELEASE), "--data", str(text), "--seq-len", "32", "--batch-size",
                         batch, "--set", cache, "--no-progress"]) == 0
        scores.append(json.loads(capsys.readouterr().out))
    windows = scores[0]["tokens"] // 32
    assert 2 < windows < 16 and rows == [windows, 2]  # one batch of the text's windows; batch 2 kept as given
    assert scores[1]["tokens"] == scores[0]["tokens"]
    assert scores[1]["loss"] == pytest.approx(scores[0]["loss"], rel=1e-5)


@pytest.mark.parametrize("argv, message", [
    (["sample", "--workdir", "w", "--num-samples", "0"], "argument --num-samples: must be >= 1, got 0"),
    (["sample", "--workdir", "w", "--temperature", "nan"], "argument --temperature: must be a finite number >= 0, got nan"),
    (["sample", "--workdir", "w", "--top-k", "-3"], "argument --top-k: must be >= 0, got -3"),
    (["sample", "--workdir", "w", "--max-new-tokens", "x"], "argument --max-new-tokens: expected a whole number, got 'x'"),
    (["evaluate", "--workdir", "w", "--max-batches", "-1"], "argument --max-batches: must be >= 0, got -1"),
    (["bench", "--peak-flops", "-1"], "argument --peak-flops: must be a finite number > 0, got -1"),
    (["pretrain", "--workdir", "w", "--simulate-devices", "0"], "argument --simulate-devices: must be >= 1, got 0"),
    # ran for minutes, or aborted in C++ (pthread_create failed)
    (["sample", "--workdir", "w", "--simulate-devices", "100000"],
     "argument --simulate-devices: must be <= 8192, got 100000"),
    (["convert", "a", "b", "--to", "onnx"], "argument --to: invalid choice: 'onnx' (choose from 'hf', 'jax')"),
])
def test_a_bad_flag_value_is_one_line_naming_the_flag_not_a_usage_block(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(argv)
    err = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and err == [f"gpt1-jax {argv[0]}: error: {message} (see gpt1-jax {argv[0]} --help)"]


def test_a_prompt_that_is_not_utf8_is_one_line(capsys, monkeypatch, tmp_path):
    """Bytes that are not UTF-8 reach Python's argv as lone surrogates, which the tokenizer rejects with a TypeError."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    prompt = b"\xff\xfe".decode("utf-8", "surrogateescape")
    assert cli.main(["sample", "--workdir", str(tmp_path), "--prompt", prompt]) == 2
    assert _one_error_line(capsys, "sample") == "gpt1-jax sample: error: --prompt is not UTF-8 text: give the prompt in UTF-8"
    # UTF-8 typed in a C/POSIX locale: Python decoded each byte apart (as ASCII, escaped); the bytes themselves are
    # UTF-8 text, which was refused as not being so
    c_locale = b"th\xc3\xa9".decode("ascii", "surrogateescape")
    assert cli.main(["sample", "--init", str(RELEASE), "--prompt", c_locale, "--max-new-tokens", "2"]) == 0
    assert all(line.startswith("thé >> ") for line in capsys.readouterr().out.splitlines()[1:])


def test_sample_says_what_it_generates_before_it_generates(capsys, monkeypatch):
    """`sample --max-new-tokens 500 --num-samples 4` on 117M was silent for 44 s (one compiled program), and even its
    header came at the end: the header first, then a status line on stderr; the samples on stdout as before."""
    from gpt1_jax import generate

    seen = []

    def sample(config, params, prompt_ids, **kw):  # what the user had read when generation began
        seen.append(capsys.readouterr())
        return [[]] * kw["num_samples"]

    monkeypatch.setattr(generate, "sample", sample)
    assert cli.main(["sample", "--init", str(RELEASE), "--max-new-tokens", "7", "--num-samples", "2"]) == 0
    assert seen[0].out == f"# {RELEASE}, temperature 0.8, top-k 40\n"
    assert seen[0].err == "sample: generating 7 tokens x 2 samples ...\n"
    assert capsys.readouterr() == ("the >> \nthe >> \n", "")
    assert cli.main(["sample", "--init", str(RELEASE), "--max-new-tokens", "7", "--no-progress"]) == 0
    assert seen[1] == (f"# {RELEASE}, temperature 0.8, top-k 40\n", "")  # the status line goes, as on other verbs


def test_verify_says_each_checkpoint_as_it_checks_it(tmp_path, capsys, monkeypatch):
    """verify hashed every checkpoint (seconds each on 117M) before it printed a line; the lines and the exit status
    are the same."""
    for step in (3, 6, 9):
        (tmp_path / "checkpoints" / str(step)).mkdir(parents=True)

    def checkpoint_damage(folder):
        print(f"hashing {folder.name}")
        return "state/x differs from its recorded digest" if folder.name == "6" else None

    monkeypatch.setattr(integrity, "verify", checkpoint_damage)
    assert cli.main(["verify", "--workdir", str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "hashing 3", "step 3: ok", "hashing 6", "step 6: damaged: state/x differs from its recorded digest",
        "hashing 9", "step 9: ok", "config.yaml: missing"]


def test_verify_checks_a_converted_folders_weights_and_records_an_older_ones(tmp_path, capsys):
    """`verify --workdir` on a `convert --to jax` folder said "no checkpoints/ folder": its weights keep digests
    now, checked as a run's checkpoints are; one written before them is recorded once it reads back."""
    ours = tmp_path / "ours"
    assert cli.main(["convert", str(RELEASE), str(ours), "--to", "jax"]) == 0
    capsys.readouterr()
    assert cli.main(["verify", "--workdir", str(ours)]) == 0
    assert capsys.readouterr().out.splitlines() == ["params: ok", "config.yaml: ok"]
    (ours / "params" / "integrity.json").unlink()  # as convert wrote it before the digests
    assert cli.main(["verify", "--workdir", str(ours)]) == 1
    assert capsys.readouterr().out.startswith("params: no integrity.json (written before `convert --to jax` kept")
    assert cli.main(["verify", "--workdir", str(ours), "--record-missing"]) == 0
    assert capsys.readouterr().out.splitlines() == ["params: digests recorded (written without them)", "params: ok",
                                                    "config.yaml: ok"]
    data = max((ours / "params").rglob("d/*"), key=lambda f: f.stat().st_size)
    flipped = bytearray(data.read_bytes())
    flipped[len(flipped) // 2] ^= 1
    data.write_bytes(bytes(flipped))
    assert cli.main(["verify", "--workdir", str(ours)]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (f"params: damaged: {data.relative_to(ours / 'params')} differs "
                                                       "from its recorded digest")


def test_convert_overwrite_replaces_a_model_folder_but_never_a_run_or_a_stranger(tmp_path, capsys, monkeypatch):
    """--overwrite deleted whatever DST held: a fine-tuning run's checkpoints and results, a pre-training run."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    dst = tmp_path / "dst"
    for held, message in [({"run.json": "{}", "checkpoints/4/x": "", "results.json": "{}"},
                           f"{dst} holds a gpt1-jax run (run.json, checkpoints), which --overwrite would delete"),
                          ({"notes.txt": "mine", "data.csv": ""},
                           f"{dst} holds data.csv, notes.txt and no model (no config.json, nor config.yaml with params/)")]:
        for name, text in held.items():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            (dst / name).write_text(text)
        before = sorted(str(p.relative_to(dst)) for p in dst.rglob("*"))
        assert cli.main(["convert", str(RELEASE), str(dst), "--overwrite"]) == 2
        assert _one_error_line(capsys, "convert").startswith(f"gpt1-jax convert: error: {message}")
        assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*")) == before
        shutil.rmtree(dst)
    # a model folder (a previous conversion) is what --overwrite replaces
    assert cli.main(["convert", str(RELEASE), str(dst)]) == 0
    (dst / "stale.txt").write_text("from the last conversion")
    gone = gone_pid()
    (tmp_path / f".tmp-dst-{gone}-x1").mkdir()  # what a convert killed mid-write left
    (tmp_path / f".dst.old-{gone}").mkdir()  # and one killed while deleting the folder it replaced
    (tmp_path / f".dst.old-{gone}" / "model.safetensors").write_text("half deleted")
    old = os.umask(0o022)
    try:
        assert cli.main(["convert", str(RELEASE), str(dst), "--overwrite"]) == 0
    finally:
        os.umask(old)
    assert (dst / "model.safetensors").is_file() and not (dst / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]  # the killed writer's folder, the old one: gone
    assert dst.stat().st_mode & 0o777 == 0o755  # the umask's (and the files' too, not safetensors' 0600)
    assert {p.stat().st_mode & 0o777 for p in dst.iterdir()} == {0o644}
    # a link to a model folder (models/current -> v1) is written through: the link stays, its target is replaced
    (tmp_path / "current").symlink_to("dst")
    (dst / "stale.txt").write_text("from the last conversion")
    assert cli.main(["convert", str(RELEASE), str(tmp_path / "current"), "--overwrite"]) == 0
    assert (tmp_path / "current").is_symlink() and os.readlink(tmp_path / "current") == "dst"
    assert (dst / "model.safetensors").is_file() and not (dst / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "dst"]


def test_tokenize_trains_the_bpe_of_the_job_it_runs_ahead_of(tmp_path, capsys, monkeypatch):
    """`tokenize --tokenizer train` trained 40,478 tokens whatever the job: pretrain --config gpt1 (40,475) and the
    default small preset (8,189) then found a BPE of another size and trained their own, and the cache built ahead
    was another's."""
    from gpt1_jax.config import PretrainConfig, preset

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"the cat number {i} sat on the mat and looked at dog {i % 7}." for i in range(200)))
    for config, size in (("tiny", preset(PretrainConfig, "tiny").data.vocab_size), (None, PretrainConfig().data.vocab_size)):
        workdir = tmp_path / f"run-{config}"
        argv = ["tokenize", "--data", str(corpus), "--tokenizer", "train", "--workdir", str(workdir), "--no-progress"]
        assert cli.main(argv + (["--config", config] if config else [])) == 0
        assert json.loads((workdir / "tokenizer.meta.json").read_text())["vocab_size"] == size


def test_pretrain_refuses_a_schedule_it_would_replace_before_writing_anything(tmp_path, capsys):
    """--set optim.total_steps (the run's --steps replaced it) and a warmup reaching the last step (ended a step
    before it), each recorded in config.yaml as the replacement, without a word."""
    for given, line in (("optim.total_steps=9", "optim.total_steps is the run's --steps in pre-training"),
                        ("optim.warmup_steps=50", "optim.warmup_steps=50 leaves none of the run's 50 steps to decay")):
        assert cli.main(["pretrain", "--workdir", str(tmp_path / "run"), "--config", "tiny", "--set", given]) == 2
        assert line in capsys.readouterr().err
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("optimizer", SECOND_MOMENT_OPTIMIZERS)
def test_float16_parameters_are_refused_where_the_optimizer_cannot_update_them(optimizer, tmp_path, capsys):
    """model.param_dtype=float16 with an optimizer dividing by its second moments' root plus eps trained to NaN
    parameters in its first update, and said `(lower optim.lr?)`; now refused before anything is written. The
    optimizers without (sgd, sgd_nesterov, lion) train float16 parameters, and evaluating them is no training."""
    argv = ["pretrain", "--workdir", str(tmp_path / "run"), "--config", "tiny", "--set", "model.param_dtype=float16",
            "--set", f"optim.name={optimizer}"]
    assert cli.main(argv) == 2
    assert (f"model.param_dtype=float16 cannot train with optim.name={optimizer}: its state takes the parameters' "
            "dtype") in _one_error_line(capsys, "pretrain")
    assert not (tmp_path / "run").exists()
    for name in set(OPTIMIZER_NAMES) - set(SECOND_MOMENT_OPTIMIZERS):
        check_storage(ModelConfig(param_dtype="float16"), OptimConfig(name=name))
    check_storage(ModelConfig(param_dtype="bfloat16"), OptimConfig(name=optimizer))


def test_finetune_refuses_a_config_preset_of_another_architecture_than_its_init(tmp_path, capsys, glue_dir):
    """`finetune --task rte --init R --config tiny` trained R's 4 x 256 model without a word, where `--set
    model.n_layers=2` was refused: the same refusal, before anything is written."""
    workdir = tmp_path / "ft"
    assert cli.main(["finetune", "--task", "rte", "--init", str(RELEASE), "--config", "tiny", "--data-dir",
                     str(glue_dir), "--workdir", str(workdir)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpt1-jax finetune: error: --config tiny is another architecture "
                                                   f"than {RELEASE} records (n_positions=64 in tiny, 256 in the files")
    assert not workdir.exists()


def test_version_names_the_package_and_the_libraries_its_numbers_depend_on(capsys):
    import importlib.metadata
    import platform

    import flax
    import jax

    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out  # one line, unwrapped whatever the terminal's width
    assert out.startswith(f"gpt1-jax {importlib.metadata.version('gpt1-jax')} (")
    for name, version in [("jax", jax.__version__), ("flax", flax.__version__),
                          ("orbax-checkpoint", importlib.metadata.version("orbax-checkpoint"))]:
        assert f"{name} {version}" in out
    assert f"Python {platform.python_version()})" in out
