"""`gpt1-jax compare RUN...`: pre-training runs overlaid in one figure against tokens seen, each named by its folder
and what sets its config apart, and a table of where each ended; a folder it cannot draw is one line, and a figure
replaces a file only when told to. Three real tiny runs, a few seconds each; the figures are written as SVG with
their text kept as text, so what a legend or title says is read back from the file."""

import json
from pathlib import Path

import matplotlib
import pytest

from gpt1_jax import cli
from gpt1_jax.metrics import plot_losses, read_metrics
from gpt1_jax.workdir import Identity, claim
from tests.support.cli import _one_error_line

STEPS = 6
RUNS = {"adamw": ["--set", "optim.name=adamw"],
        "lion": ["--optim", "lion", "--lr", "3e-4", "--tracker", "tensorboard"],  # tracker: bookkeeping, not said
        "big": ["--set", "optim.name=adamw", "--batch-size", "16"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("runs")
    for name, flags in RUNS.items():
        argv = ["pretrain", "--workdir", str(where / name), "--config", "tiny", "--steps", str(STEPS), "--no-progress",
                "--tracker", "none", "--set", "eval_every=3", "--set", f"data.cache_dir={where / 'cache'}", *flags]
        assert cli.main(argv) == 0
    return where


def _compare(argv: list[str]) -> int:
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as <text>, not glyph paths
        return cli.main(["compare", *argv])


def test_compare_overlays_the_runs_and_tables_where_each_ended(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(runs)
    out = tmp_path / "cmp.svg"
    assert _compare(["adamw", "lion", "big", "--out", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert stderr == f"compare: figure: {out}\n"
    svg = out.read_text()
    for label in ("adamw: optim.name=adamw, optim.lr=0.003, data.global_batch_size=8",
                  "lion: optim.name=lion, optim.lr=0.0003, data.global_batch_size=8",
                  "big: optim.name=adamw, optim.lr=0.003, data.global_batch_size=16",
                  "tokens seen (steps x global batch x seq_len)", "learning rate", "validation loss"):
        assert label in svg, label
    assert "tracker" not in svg and "total_steps" not in svg  # the same training, whatever they say
    header, *rows = stdout.splitlines()
    assert header.split()[:3] == ["run", "steps", "tokens"] and len(rows) == 3
    for row, (name, batch) in zip(rows, (("adamw", 8), ("lion", 8), ("big", 16))):
        cells = row.split()
        metrics = read_metrics(runs / name)
        val = [r["val_loss"] for r in metrics if "val_loss" in r]
        train = [r["loss"] for r in metrics if "loss" in r]
        assert cells[:3] == [name, str(STEPS), f"{STEPS * batch * 64:,}"]  # tokens: steps x batch x seq_len 64
        assert float(cells[3]) == pytest.approx(train[-1], abs=1e-4)  # under 50 steps, the curve is the points
        assert cells[4:7] == [f"{min(val):.4f}", f"({3 + 3 * val.index(min(val))})", f"{val[-1]:.4f}"]
        rates = [r["tokens_per_s"] for r in metrics if "tokens_per_s" in r]
        assert rates and float(cells[7].replace(",", "")) > 0
    assert rows[1].endswith("optim.name=lion, optim.lr=0.0003, data.global_batch_size=8")


def test_one_run_alone_is_drawn_with_its_folder_for_a_label(runs, tmp_path, capsys, monkeypatch):
    """'~' is the home folder in RUN and --out, as in every path flag."""
    monkeypatch.setenv("HOME", str(runs))
    out = tmp_path / "one.svg"
    assert _compare(["~/lion", "--out", "~/../" + str(out.relative_to(runs.parent))]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("  -")  # nothing to tell it apart from
    svg = out.read_text()
    assert str(runs / "lion") in svg and "optim.name" not in svg


def test_the_figure_replaces_a_file_only_when_told_to(runs, tmp_path, capsys, monkeypatch):
    """The default figure is compare.png in the current folder: a second compare (or a file of the user's that is
    named so) is refused, untouched, until --overwrite."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "compare.png").write_text("mine")
    argv = [str(runs / "adamw"), str(runs / "lion")]
    assert _compare(argv) == 2
    assert _one_error_line(capsys, "compare") == ("gpt1-jax compare: error: --out compare.png exists; nothing was "
                                                  "written: pass --overwrite to replace it, or name another file")
    assert (tmp_path / "compare.png").read_text() == "mine"
    assert _compare([*argv, "--overwrite"]) == 0
    assert (tmp_path / "compare.png").read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare.png"]  # written whole: no temporary file left


def _write_finetuning_run(folder: Path) -> None:
    claim(folder, Identity("finetune", "cola", "none"), {})
    (folder / "config.yaml").write_text("task: cola\n")


@pytest.mark.parametrize("make, argv, message", [
    (None, ["nothere"], "nothere does not exist: give a pre-training run's workdir"),
    (lambda d: (d / "afile").write_text("x"), ["afile"], "afile is a file: give a pre-training run's workdir"),
    (lambda d: (d / "empty").mkdir(), ["empty"], "empty is not a pre-training workdir (it holds no run)"),
    (lambda d: (d / "ft").mkdir() or _write_finetuning_run(d / "ft"), ["ft"],
     "ft holds a fine-tuning run of cola from none, not a pre-training run: compare overlays pre-training runs"),
    (None, ["{runs}/adamw", "{runs}/adamw/"], "a run is given twice: name each run once"),
    (None, ["{runs}/adamw", "--out", "figure.txt"], "--out figure.txt: name a figure file ending in one of .eps, "),
    (None, ["{runs}/adamw", "--out", "no/such/folder/f.png"], "--out no/such/folder/f.png: its folder no/such/folder "
                                                              "does not exist"),
    (lambda d: (d / "sub").mkdir(), ["{runs}/adamw", "--out", "sub"], "--out sub is a folder: name a file"),
    (lambda d: (d / "notes").write_text("x"), ["{runs}/adamw", "--out", "notes/f.png"],  # it said "does not exist"
     "--out notes/f.png: notes is a file, not a folder"),
])
def test_what_compare_cannot_draw_is_one_line_and_writes_nothing(runs, tmp_path, capsys, monkeypatch, make, argv,
                                                                   message):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    if make is not None:
        make(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cli.main(["compare", *(a.format(runs=runs) for a in argv)]) == 2
    assert _one_error_line(capsys, "compare").startswith(f"gpt1-jax compare: error: {message}")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_run_with_no_loss_yet_is_one_line(runs, tmp_path, capsys, monkeypatch):
    """A run claimed and configured, killed before its first step (or diverged at it): nothing to draw."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    young = tmp_path / "young"
    young.mkdir()
    for name in ("run.json", "config.yaml"):
        (young / name).write_bytes((runs / "adamw" / name).read_bytes())
    monkeypatch.chdir(tmp_path)
    for metrics in (None, json.dumps({"step": 1, "loss": "nan"}) + "\n"):
        if metrics is not None:
            (young / "metrics.jsonl").write_text(metrics)
        assert cli.main(["compare", str(runs / "adamw"), "young"]) == 2
        assert _one_error_line(capsys, "compare") == (
            "gpt1-jax compare: error: young has no finite loss in young/metrics.jsonl (no step trained yet, or it "
            "diverged at its first): nothing to draw")
    assert not (tmp_path / "compare.png").exists()
    with pytest.raises(SystemExit):  # fewer than one run: argparse's one line
        cli.build_parser().parse_args(["compare"])
    assert capsys.readouterr().err == ("gpt1-jax compare: error: the following arguments are required: RUN (see "
                                       "gpt1-jax compare --help)\n")


def test_a_runs_loss_plot_is_titled_with_its_optimizer(runs, tmp_path):
    """loss.png said only the folder's name: a copy of it beside another's did not say which optimizer it was."""
    out = tmp_path / "loss.svg"
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        plot_losses(runs / "lion", out)
    assert "lion: lion, lr 0.0003, warmup_cosine" in out.read_text()
