"""`predict`: a finished fine-tuning run's classifier on new inputs. Real tiny runs on the GLUE fixtures (a few
seconds each, once for the file): their own dev files give back their predictions/validation.tsv exactly."""

import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest

from gpt1_jax import finetune
from gpt1_jax.checkpoint import restore_params
from gpt1_jax.config import FinetuneConfig, model_preset
from gpt1_jax.errors import ConfigError, DataError, OutputExistsError, WorkdirError
from gpt1_jax.predict import open_run, predict, run_params, write_tsv
from gpt1_jax.workdir import Identity, claim


@pytest.fixture(scope="module")
def runs(tmp_path_factory, glue_dir):
    """STS-B (regression: its scores show any difference) over 2 epochs with schedule-free AdamW (scored at its x
    sequence), and SST-2 (one text an input) with GPT-1's Adam: task -> its finished run folder."""
    root = tmp_path_factory.mktemp("predict")
    for task, epochs, optimizer in (("stsb", 2, "schedule_free_adamw"), ("sst2", 1, "gpt1_adam")):
        base = FinetuneConfig(task=task, model=model_preset("tiny"), batch_size=8, epochs=epochs)
        config = dataclasses.replace(base, optim=dataclasses.replace(base.optim, name=optimizer, lr=1e-3))
        outcome = finetune.run(config, root / task, init="none", data_dir=str(glue_dir), progress=False,
                               tfds_dir=str(root / "tfds"))
        assert outcome.status == "finished"
    return {task: root / task for task in ("stsb", "sst2")}


def _rows(tsv: str) -> list[list[str]]:
    return [line.split("\t") for line in tsv.splitlines()]


def _run_predictions(workdir) -> list[list[str]]:
    """The run's own predictions/validation.tsv as `index<TAB>prediction` rows (its label column dropped)."""
    return [row[:2] for row in _rows((workdir / "predictions" / "validation.tsv").read_text())]


@pytest.mark.parametrize("name", ["stsb", "sst2"])
def test_the_runs_own_dev_file_gives_its_predictions(runs, glue_dir, name):
    workdir = runs[name]
    folder = "SST-2" if name == "sst2" else "STS-B"
    got = predict(workdir, glue_dir / folder / "dev.tsv")
    assert _rows(got.tsv()) == _run_predictions(workdir)
    results = json.loads((workdir / "results.json").read_text())
    assert (got.run.epoch, got.run.step) == (results["epoch"], results["step"])
    if name != "sst2":
        assert got.values.dtype == np.float32 and len(got.values) == 11 and np.std(got.values) > 0
        assert all(float(p) == pytest.approx(v, rel=1e-5) for p, v in zip(got.labels(), got.values))
    else:
        assert set(got.labels()) <= {"negative", "positive"}


def test_schedule_free_runs_are_scored_at_x(runs):
    """The run scored its x sequence (optim.eval_params), not the checkpoint's params (y): so does predict, and the
    dev file's scores above match the run's only so."""
    run = open_run(runs["stsb"])
    (y,), _ = restore_params(run.workdir / "checkpoints", [("params",)], step=run.step)
    x = run_params(run)
    assert jax.tree.structure(x) == jax.tree.structure(y)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y)))


def test_the_best_epochs_checkpoint_is_read_not_the_latest(runs, tmp_path):
    """The STS-B run keeps both epochs' checkpoints; its results.json pointed at the other one gives other scores."""
    workdir = tmp_path / "run"
    shutil.copytree(runs["stsb"], workdir)
    results = json.loads((workdir / "results.json").read_text())
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert len(steps) == 2 and results["step"] in steps
    best = predict(workdir, [("A man plays a guitar.", "A man is playing music.")]).values
    results["step"] = next(s for s in steps if s != results["step"])
    (workdir / "results.json").write_text(json.dumps(results))
    other = predict(workdir, [("A man plays a guitar.", "A man is playing music.")])
    assert other.run.step == results["step"] and other.values[0] != best[0]


def test_columns_in_any_order_extra_ones_and_an_index_column(runs, glue_dir, tmp_path):
    header, *rows = _rows((glue_dir / "STS-B" / "dev.tsv").read_text())
    col = {name: header.index(name) for name in ("sentence1", "sentence2", "score")}
    shuffled = tmp_path / "shuffled.tsv"  # the score (a label) kept, an unknown column, no index column
    s1, s2, score = col["sentence1"], col["sentence2"], col["score"]
    shuffled.write_text("score\tsentence2\tnote\tsentence1\n"
                        + "".join(f"{r[score]}\t{r[s2]}\tx\t{r[s1]}\n" for r in rows))
    expected = _run_predictions(runs["stsb"])
    assert _rows(predict(runs["stsb"], shuffled).tsv()) == expected
    named = tmp_path / "named.tsv"  # an index column names each output row
    named.write_text("sentence1\tindex\tsentence2\n"
                     + "".join(f"{r[col['sentence1']]}\tpair-{i}\t{r[col['sentence2']]}\n" for i, r in enumerate(rows)))
    got = _rows(predict(runs["stsb"], named).tsv())
    assert got[0] == ["index", "prediction"] and [r[0] for r in got[1:]] == [f"pair-{i}" for i in range(len(rows))]
    assert [r[1] for r in got[1:]] == [r[1] for r in expected[1:]]
    # from Python: the texts of each input in the task's order
    pairs = [(r[col["sentence1"]], r[col["sentence2"]]) for r in rows]
    assert _rows(predict(runs["stsb"], pairs).tsv()) == expected


def test_plain_text_one_input_per_line_equals_the_tsv(runs, glue_dir, tmp_path):
    sentences = [line.split("\t")[0] for name in ("dev", "train")
                 for line in (glue_dir / "SST-2" / f"{name}.tsv").read_text().splitlines()[1:]]
    text = tmp_path / "reviews.txt"  # no tab, and its first line is no column name: plain text
    text.write_text("".join(f"{s}\n" for s in sentences))
    tsv = tmp_path / "reviews.tsv"  # a single-column TSV: its header alone says so
    tsv.write_text("sentence\n" + "".join(f"{s}\n" for s in sentences))
    from_text, from_tsv = predict(runs["sst2"], text), predict(runs["sst2"], tsv)
    assert _rows(from_text.tsv()) == _rows(from_tsv.tsv()) == _rows(predict(runs["sst2"], sentences).tsv())
    assert [r[0] for r in _rows(from_text.tsv())[1:]] == [str(i) for i in range(len(sentences))]
    assert len(sentences) == 9 and set(from_text.labels()) <= {"negative", "positive"}
    # forced: the same file read as text holds its header as one more input
    assert len(predict(runs["sst2"], tsv, fmt="text").values) == 10


def test_a_long_input_is_cut_as_the_run_cut_its_own_and_batched(runs, capsys):
    """1,000 inputs in batches of the run's eval size (8, a handful of padded lengths); a text longer than a segment
    (n_ctx 64 keeps 30 tokens) is said and cut, giving the prediction of its first 30 tokens."""
    words = "the film is good and the cast is great but the plot is thin".split()
    long = " ".join(words * 10)
    inputs = [words[i % len(words)] for i in range(999)] + [long]
    got = predict(runs["sst2"], inputs)
    tok = got.run.tokenizer
    assert len(got.values) == 1000 and got.cut == sum(len(tok.encode(x)) > 30 for x in inputs) >= 1
    assert f"{got.cut} of 1000 inputs have a text longer than a segment's 30 tokens (n_ctx 64): cut to it" in \
        capsys.readouterr().err
    assert got.labels()[-1] == predict(runs["sst2"], [tok.decode(tok.encode(long)[:30])]).labels()[0]
    assert got.labels()[: len(words)] == predict(runs["sst2"], inputs[: len(words)]).labels()


def test_the_output_file_is_written_whole_and_kept_unless_told(runs, glue_dir, tmp_path):
    got = predict(runs["sst2"], glue_dir / "SST-2" / "test.tsv")
    out = write_tsv(got, tmp_path / "out" / "SST-2.tsv")
    assert out.read_text() == got.tsv() and _rows(out.read_text())[0] == ["index", "prediction"]
    assert [r[0] for r in _rows(out.read_text())[1:]] == ["0", "1", "2"]
    out.write_text("mine\n")
    with pytest.raises(OutputExistsError, match=r"--out .*SST-2.tsv exists; nothing was written: pass --overwrite to replace it"):
        write_tsv(got, out)
    assert out.read_text() == "mine\n"
    assert write_tsv(got, out, overwrite=True).read_text() == got.tsv()
    with pytest.raises(OutputExistsError, match="is a folder"):
        write_tsv(got, tmp_path)
    assert sorted(p.name for p in out.parent.iterdir()) == ["SST-2.tsv"]  # no temporary file left


def _one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def test_folders_that_are_not_a_finished_fine_tuning_run_are_refused(runs, tmp_path):
    with pytest.raises(WorkdirError, match="no such folder") as e:
        predict(tmp_path / "missing", ["good"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkdirError, match="holds no gpt1-jax run, not a fine-tuning run") as e:
        predict(tmp_path / "empty", ["good"])
    claim(tmp_path / "lm", Identity("pretrain"), {})  # what a pre-training run records first
    with pytest.raises(WorkdirError, match="holds a pre-training run, not a fine-tuning run") as e:
        predict(tmp_path / "lm", ["good"])
    _one_line(e)
    unfinished = tmp_path / "unfinished"
    shutil.copytree(runs["sst2"], unfinished)
    (unfinished / "results.json").unlink()
    with pytest.raises(WorkdirError, match=r"run of sst2 that has not finished \(no results.json; step 1 of 1\): "
                                           "run its finetune command again") as e:
        predict(unfinished, ["good"])
    _one_line(e)
    gone = tmp_path / "gone"
    shutil.copytree(runs["sst2"], gone)
    shutil.rmtree(gone / "checkpoints" / "1")
    with pytest.raises(WorkdirError, match=r"the best epoch's checkpoint \(step 1\) is gone") as e:
        predict(gone, ["good"])
    _one_line(e)


def test_inputs_that_cannot_be_read_are_one_line_each(runs, tmp_path):
    def refused(error, content: str, match: str, workdir=runs["stsb"], **kwargs):
        path = tmp_path / "in.tsv"
        path.write_text(content)
        with pytest.raises(error, match=match) as e:
            predict(workdir, path, **kwargs)
        return _one_line(e)

    said = refused(DataError, "index\tsentence1\tlabel\n0\ta\t1\n", "header lacks")
    assert said == f"{tmp_path / 'in.tsv'}:1: the header lacks the column STS-B needs: sentence2; found index, " \
                   "sentence1, label"
    refused(DataError, "sentense\tlabel\nfine\t1\n", r"lacks the column SST-2 needs: sentence; found sentense, label "
            r"\(plain text, one input per line: --format text\)", workdir=runs["sst2"])
    refused(DataError, "", r"in.tsv: no inputs in it \(an empty file\)")
    refused(DataError, "\n\n", r"in.tsv: no inputs in it \(an empty file\)", workdir=runs["sst2"])
    refused(DataError, "sentence1\tsentence2\n", r"in.tsv: no inputs in it \(only its header\)")
    refused(DataError, "sentence1\tsentence2\na\tb\nc\n", r"in.tsv:3: expected 2 tab-separated fields, as the header "
                                                         r"has, got 1")
    refused(ConfigError, "a dog runs\n", r"--format text: STS-B takes 2 texts an input: give a TSV with the columns "
                                         r"sentence1, sentence2 \(plain text", fmt="text")
    refused(DataError, "a dog runs\n", r"in.tsv:1: no tab in it: STS-B takes 2 texts an input")
    (tmp_path / "bytes.tsv").write_bytes(b"sentence\n\xff\xfe\n")
    with pytest.raises(DataError, match=r"bytes.tsv: not UTF-8 text \(byte 9\)"):
        predict(runs["sst2"], tmp_path / "bytes.tsv")
    with pytest.raises(DataError, match="no inputs to predict"):
        predict(runs["sst2"], [])
    with pytest.raises(DataError, match=r"STS-B takes 2 texts an input \(sentence1, sentence2\), got 1"):
        predict(runs["stsb"], ["a dog runs"])
    with pytest.raises(ConfigError, match="--batch-size"):  # 8 devices here: a batch of 6 does not divide
        predict(runs["sst2"], ["good"], batch_size=6)


def test_colas_header_less_dev_layout_is_read_and_a_typo_in_a_header_is_not_taken_for_it(glue_dir):
    from gpt1_jax.data.glue import glue_task, read_tsv
    from gpt1_jax.predict import read_inputs

    cola = glue_task("cola")
    path = glue_dir / "CoLA" / "dev.tsv"
    got = read_inputs(cola, path.read_text(encoding="utf-8"), str(path))
    assert [(ex["sentence"], ex["idx"]) for ex in got] == [(ex["sentence"], ex["idx"])
                                                           for ex in read_tsv(path, cola, "validation")]
    with pytest.raises(DataError, match="lacks the column CoLA needs: sentence; found source, label, mark, sentense"):
        read_inputs(cola, "source\tlabel\tmark\tsentense\nx\t1\t\tok\n", "typo.tsv")


def test_the_predict_verb_prints_or_writes_the_predictions_and_refuses_in_one_line(runs, glue_dir, tmp_path, capsys):
    from gpt1_jax import cli

    dev = glue_dir / "SST-2" / "dev.tsv"
    assert cli.main(["predict", "--workdir", str(runs["sst2"]), str(dev)]) == 0
    out, err = capsys.readouterr()
    assert _rows(out) == _run_predictions(runs["sst2"])
    assert err.startswith("predict sst2: ") and "predictions of" in err
    target = tmp_path / "preds.tsv"
    assert cli.main(["predict", "--workdir", str(runs["sst2"]), str(dev), "--out", str(target), "--no-progress"]) == 0
    assert capsys.readouterr() == ("", "") and target.read_text() == out
    for argv, message in [(["--out", str(target)], f"--out {target} exists"),
                          (["--set", "optim.lr=1"], "--set optim.lr=1 does not apply to predict"),
                          (["--overwrite"], "--overwrite goes with --out FILE")]:
        assert cli.main(["predict", "--workdir", str(runs["sst2"]), str(dev), *argv]) == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpt1-jax predict: error: ") and message in lines[0]
