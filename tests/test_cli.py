"""The one command line: every verb that runs a model takes the shared flags; a project error ends as one
line (exit 2, or 1 for a diverged run), anything else keeps its traceback. No model is run: seconds."""

import pytest

from gpt1_jax import cli
from gpt1_jax.errors import CheckpointFormatError, DataError, DivergenceError

SHARED = ["--config", "tiny", "--set", "a=1", "--set", "b.c=2", "--mesh", "fsdp=2", "--seed", "3",
          "--simulate-devices", "2"]
REQUIRED = {"pretrain": ["--workdir", "w"], "finetune": ["--task", "cola", "--init", "none", "--workdir", "w"],
            "evaluate": ["--workdir", "w"], "sample": ["--workdir", "w"], "bench": [], "plan": []}


def test_every_model_verb_takes_the_shared_flags():
    assert {name for name, verb in cli.VERBS.items() if verb.runs_model} == set(REQUIRED)
    parser = cli.build_parser()
    for verb, required in REQUIRED.items():
        args = parser.parse_args([verb, *required, *SHARED])
        assert (args.config, args.set, args.mesh, args.seed, args.simulate_devices) == \
            ("tiny", ["a=1", "b.c=2"], "fsdp=2", 3, 2), verb
        assert args.coordinator is None  # and the multi-process flags, on every verb
    with pytest.raises(SystemExit):  # convert runs no model
        parser.parse_args(["convert", "src", "dst", "--mesh", "fsdp=2"])


def test_flags_then_set_in_that_order():
    args = cli.build_parser().parse_args(["pretrain", "--workdir", "w", "--seed", "5", "--steps", "9",
                                          "--set", "seed=6"])
    assert cli._overrides(args, cli.PRETRAIN_FLAGS) == ["steps=9", "seed=5", "data.seed=5", "seed=6"]


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
])
def test_a_shared_flag_a_verb_cannot_honour_is_refused(capsys, argv, message):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"gpt1-jax {argv[0]}: error: {message}")
