"""GLUE: the TSV reader on files in the official layout (tests/fixtures/glue; the full files where
../shared has them) and on malformed ones, our tfds builder read back through
data_source, the real builder's quick offline failure, the official metrics, and the RACE reader."""

import io
import json
import tarfile
import tempfile
import time

import numpy as np
import pytest

from gpt1_jax.data import glue
from gpt1_jax.data.race import check_archive, load_race, race_reader
from gpt1_jax.errors import ConfigError, DataError

COUNTS = {  # the official row counts (README of ../shared)
    ("cola", "train"): 8551, ("cola", "validation"): 1043, ("sst2", "train"): 67349, ("sst2", "validation"): 872,
    ("mrpc", "train"): 3668, ("mrpc", "validation"): 408, ("stsb", "train"): 5749, ("stsb", "validation"): 1500,
    ("rte", "train"): 2490, ("rte", "validation"): 277, ("qnli", "validation"): 5463,
}
TEST_COUNTS = {"cola": 1063, "sst2": 1821, "mrpc": 1725, "stsb": 1379, "rte": 3000, "qnli": 5463}
FIXTURE_COUNTS = {  # tests/fixtures/glue
    ("cola", "train"): 6, ("cola", "validation"): 3, ("sst2", "train"): 6, ("sst2", "validation"): 3,
    ("mrpc", "train"): 4, ("mrpc", "validation"): 3, ("stsb", "train"): 12, ("stsb", "validation"): 11,
    ("rte", "train"): 4, ("rte", "validation"): 2, ("qnli", "validation"): 2,
}
FIXTURE_TEST_COUNTS = {"cola": 3, "sst2": 3, "mrpc": 2, "stsb": 3, "rte": 2, "qnli": 2}


def _path(root, task, split):
    t = glue.glue_task(task)
    return root / t.dirname / dict(t.files)[split]


@pytest.mark.parametrize("task,split", sorted(FIXTURE_COUNTS))
def test_files_row_counts(glue_dir, task, split):
    _check_labelled_file(_path(glue_dir, task, split), task, split, FIXTURE_COUNTS[task, split])


def test_official_files_row_counts(shared_dir):
    root = shared_dir / "data" / "glue"
    for (task, split), n in COUNTS.items():
        _check_labelled_file(_path(root, task, split), task, split, n)
    for task, n in TEST_COUNTS.items():
        _check_test_file(_path(root, task, "test"), task, n)


def _check_labelled_file(path, task, split, n):
    examples = list(glue.read_tsv(path, task, split))
    assert len(examples) == n
    t = glue.glue_task(task)
    assert [e["idx"] for e in examples] == list(range(len(examples)))
    labels = np.asarray([e["label"] for e in examples])
    if t.regression:
        assert labels.dtype == np.float64 and labels.min() >= 0 and labels.max() <= 5 and len(np.unique(labels)) > 10
    else:
        assert set(labels.tolist()) == set(range(t.n_outputs))  # every class present, no -1 in train/dev
    for f in t.features:
        assert all(isinstance(e[f], str) and e[f].strip() for e in examples)


def test_quirks(glue_dir):
    # MRPC's BOM: the header still parses (else the label column "Quality" would be missing)
    assert _path(glue_dir, "mrpc", "train").read_bytes().startswith("\ufeffQuality".encode())
    mrpc = list(glue.read_tsv(_path(glue_dir, "mrpc", "train"), "mrpc", "train"))
    assert mrpc[0]["sentence1"].startswith('The mayor called the plan "a fair deal", aides')
    # CoLA has no header: the first row is an example
    cola = list(glue.read_tsv(_path(glue_dir, "cola", "train"), "cola", "train"))
    assert cola[0] == {"sentence": "The cat chased a moth across the garden, didn't it?", "label": 1, "idx": 0}
    # SST-2's trailing spaces are kept, as tfds keeps them
    sst = list(glue.read_tsv(_path(glue_dir, "sst2", "validation"), "sst2", "validation"))
    assert sst[0]["sentence"].endswith(" ")
    # quotes are text, never CSV quoting: a field that opens with a quote stays one field
    dev = list(glue.read_tsv(_path(glue_dir, "mrpc", "validation"), "mrpc", "validation"))
    assert dev[0]["sentence2"].startswith('"The team has')


@pytest.mark.parametrize("task,n", sorted(FIXTURE_TEST_COUNTS.items()))
def test_test_files_have_no_labels(glue_dir, task, n):
    _check_test_file(_path(glue_dir, task, "test"), task, n)


def _check_test_file(path, task, n):
    examples = list(glue.read_tsv(path, task, "test"))
    assert len(examples) == n
    assert all(e["label"] == -1 for e in examples)


def _write(tmp_path, task_dir, name, text):
    d = tmp_path / task_dir
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text, encoding="utf-8")
    return d / name


@pytest.mark.parametrize(
    "task,split,text,line,what",
    [
        ("rte", "train", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\n", 3, "expected 4"),
        ("rte", "train", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n", 2, "label 'maybe'"),
        ("cola", "train", "x\t1\t\tok\nx\t1\tbad\n", 2, "expected 4"),
        ("cola", "validation", "x\t7\t\tok\n", 1, "label '7'"),
        ("stsb", "train", "index\tsentence1\tsentence2\tscore\n0\ta\tb\tfive\n", 2, "not a number"),
        ("rte", "train", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n\n1\ta\tb\tentailment\n", 3, "expected 4"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path, task, split, text, line, what):
    path = _write(tmp_path, "T", "f.tsv", text)
    with pytest.raises(ValueError, match=rf"f\.tsv:{line}: .*{what}"):
        list(glue.read_tsv(path, task, split))


def test_missing_column_and_missing_file(tmp_path):
    path = _write(tmp_path, "T", "f.tsv", "index\tpremise\tlabel\n")
    with pytest.raises(ValueError, match=r"f\.tsv:1: header lacks column"):
        list(glue.read_tsv(path, "rte", "train"))
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        list(glue.read_tsv(tmp_path / "nope.tsv", "rte", "train"))


def test_a_train_file_without_its_label_column_is_refused_and_a_dev_file_reads_as_unlabelled(tmp_path):
    """A train.tsv cut to its text columns trained every example on label -1 with exit 0. A dev file so cut still
    reads (labels -1): finetune refuses it by name, as a test file put in its place (tests/e2e/test_finetune.py)."""
    text = "index\tsentence1\tsentence2\n0\ta\tb\n"
    path = _write(tmp_path, "RTE", "train.tsv", text)
    with pytest.raises(DataError) as e:
        list(glue.read_tsv(path, "rte", "train"))
    assert str(e.value) == f"{path}:1: header lacks column(s) ['label']; got ['index', 'sentence1', 'sentence2']"
    dev = _write(tmp_path, "RTE", "dev.tsv", text)
    assert [ex["label"] for ex in glue.read_tsv(dev, "rte", "validation")] == [-1]


def test_a_file_that_is_not_text_is_one_error(tmp_path):
    path = tmp_path / "T" / "train.tsv"
    path.parent.mkdir()
    path.write_bytes(b"index\tsentence1\tsentence2\tlabel\n0\t\xd2\xff\tb\tentailment\n")
    with pytest.raises(DataError, match=r"train\.tsv: not a GLUE TSV file \(byte 34 is not UTF-8 text\)"):
        list(glue.read_tsv(path, "rte", "train"))


def test_quotes_and_odd_separators_stay_inside_fields(tmp_path):
    text = 'index\tsentence1\tsentence2\tlabel\n0\t"He said "hi\tit\u2028is "quoted\tnot_entailment\n'
    path = _write(tmp_path, "T", "f.tsv", text)
    (ex,) = glue.read_tsv(path, "rte", "train")
    assert ex == {"sentence1": '"He said "hi', "sentence2": 'it\u2028is "quoted', "label": 1, "idx": 0}


def _small_glue(tmp_path):
    root = tmp_path / "glue"
    _write(root, "RTE", "train.tsv", "index\tsentence1\tsentence2\tlabel\n"
           + "".join(f"{i}\tpremise {i} \"q\"\thypothesis {i}\t{['entailment', 'not_entailment'][i % 2]}\n" for i in range(7)))
    _write(root, "RTE", "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tp\th\tentailment\n")
    _write(root, "RTE", "test.tsv", "index\tsentence1\tsentence2\n0\tp\th\n1\tq\tr\n")
    _write(root, "STS-B", "train.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
           "0\tg\tf\ty\t0\tn\tn\ta b\tc d\t3.200\n")
    return root


def test_tfds_builder_prepares_and_reads_back_via_data_source(tmp_path, capfd, caplog, monkeypatch):
    root = _small_glue(tmp_path)
    scratch = tmp_path / "system-temp"  # tfds left an empty tmp*tfds folder there for every dataset it prepared
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    for split, n in (("train", 7), ("validation", 1), ("test", 2)):
        got = glue.load_split("rte", split, root, tfds_dir=tmp_path / "tfds")
        want = list(glue.read_tsv(root / "RTE" / dict(glue.glue_task("rte").files)[split], "rte", split))
        assert got == want and len(got) == n
    # Prepared quietly: tfds' "Downloading and preparing dataset ..." lines went to stdout, and a WARNING about the
    # folder it was writing (no dataset_info.json yet) to stderr.
    out, err = capfd.readouterr()
    assert "preparing" not in out and "Variant folder" not in err + caplog.text, (out, err, caplog.text)
    (stsb,) = glue.load_split("stsb", "train", root, tfds_dir=tmp_path / "tfds")
    assert stsb["label"] == pytest.approx(3.2) and stsb["sentence2"] == "c d"
    assert list((tmp_path / "tfds").rglob("*.array_record*"))  # prepared in array_record, no TensorFlow
    assert not list(scratch.iterdir())
    with pytest.raises(FileNotFoundError, match="no test split"):
        glue.load_split("stsb", "test", root, tfds_dir=tmp_path / "tfds")
    with pytest.raises(FileNotFoundError, match="no GLUE CoLA folder"):
        glue.load_split("cola", "train", root, tfds_dir=tmp_path / "tfds")


def test_edited_tsv_prepares_a_fresh_dataset(tmp_path):
    root = _small_glue(tmp_path)
    assert len(glue.load_split("rte", "validation", root, tfds_dir=tmp_path / "tfds")) == 1
    _write(root, "RTE", "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tp\th\tentailment\n1\tp\th\tentailment\n")
    assert len(glue.load_split("rte", "validation", root, tfds_dir=tmp_path / "tfds")) == 2


@pytest.mark.parametrize("name, text", [("dev.tsv", "index\tsentence1\tsentence2\tlabel\n"),
                                        ("test.tsv", "index\tsentence1\tsentence2\n")])
def test_a_split_without_examples_is_one_error_and_prepares_nothing(tmp_path, name, text):
    """An empty or header-only file ended in tfds' "AssertionError: Failed to finalize writing of split ... No
    examples were yielded" (a header-only test.tsv even without --predict-test), and the half-prepared dataset
    was warned about by every later run."""
    root = _small_glue(tmp_path)
    _write(root, "RTE", name, text)
    with pytest.raises(DataError, match=rf"RTE/{name}: no examples in it \(an empty file, or only its header\)"):
        glue.load_split("rte", "train", root, tfds_dir=tmp_path / "tfds")
    assert not any((tmp_path / "tfds").glob("glue_tsv-*/**/*.array_record*"))


def test_real_glue_builder_fails_fast_offline(tmp_path):
    if glue._reachable("https://dl.fbaipublicfiles.com", 3.0):
        pytest.skip("GLUE's host is reachable here: this test is about the offline failure")
    t0 = time.perf_counter()
    with pytest.raises(glue.GlueDownloadError, match="use --data-dir"):
        glue.load_split("rte", "train", None, tfds_dir=tmp_path / "tfds")
    assert time.perf_counter() - t0 < 30


def _msr_files(glue_dir, out):
    """Microsoft's two MRPC files and GLUE's dev ids, from which the fixture's MRPC folder would be made."""
    train, dev, test = ((glue_dir / "MRPC" / f"{s}.tsv").read_text(encoding="utf-8").rstrip("\n").split("\n")
                        for s in ("train", "dev", "test"))
    (out / "msr_paraphrase_train.txt").write_text("\n".join(train + dev[1:]) + "\n", encoding="utf-8")
    (out / "mrpc_dev_ids.tsv").write_text("".join("\t".join(r.split("\t")[1:3]) + "\n" for r in dev[1:]))
    labelled = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + ["1\t" + r.split("\t", 1)[1] for r in test[1:]]
    (out / "msr_paraphrase_test.txt").write_text("\n".join(labelled) + "\n", encoding="utf-8")


@pytest.fixture
def glue_host(tmp_path, glue_dir, monkeypatch):
    """tfds' GLUE addresses pointed at a server on 127.0.0.1 that serves what GLUE's hosts serve, made from the
    fixture: SST-2.zip, and MRPC's three files."""
    import functools
    import http.server
    import threading
    import zipfile

    import tensorflow_datasets.text.glue as tfds_glue

    served = tmp_path / "served"
    served.mkdir()
    with zipfile.ZipFile(served / "SST-2.zip", "w") as z:
        z.writestr("SST-2/original/notes.txt", "not a split")  # GLUE's zips hold more than the TSV files
        for f in sorted((glue_dir / "SST-2").iterdir()):
            z.write(f, f"SST-2/{f.name}")
    _msr_files(glue_dir, served)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"http://127.0.0.1:{server.server_address[1]}"
    config = next(c for c in tfds_glue.Glue.BUILDER_CONFIGS if c.name == "sst2")
    real = config.data_url
    object.__setattr__(config, "data_url", f"{host}/SST-2.zip")  # a frozen dataclass
    monkeypatch.setattr(tfds_glue, "_MRPC_TRAIN", f"{host}/msr_paraphrase_train.txt")
    monkeypatch.setattr(tfds_glue, "_MRPC_TEST", f"{host}/msr_paraphrase_test.txt")
    monkeypatch.setattr(tfds_glue, "_MRPC_DEV_IDS", f"{host}/mrpc_dev_ids.tsv")
    try:
        yield
    finally:
        object.__setattr__(config, "data_url", real)
        server.shutdown()


@pytest.mark.parametrize("task", ["sst2", "mrpc"])
def test_without_a_data_dir_glue_is_downloaded_and_read_as_from_its_files(tmp_path, glue_dir, glue_host, task, capsys):
    """Online, `finetune` without --data-dir ran tfds' own glue/<task>, which downloaded GLUE's zip and then unpacked
    it with TensorFlow (tf.compat.as_text in tfds' extractor), which gpt1-jax does not install: a traceback of
    ExtractError. Now tfds' download manager fetches the same files (here from a server on 127.0.0.1), and they are
    read as the same files under --data-dir are: every split, example for example (MRPC's made from Microsoft's
    files as GLUE's script makes them)."""
    for split in ("train", "validation", "test"):
        downloaded = glue.load_split(task, split, None, tfds_dir=tmp_path / "tfds")
        assert downloaded == glue.load_split(task, split, glue_dir, tfds_dir=tmp_path / "local"), split
        assert len(downloaded) == FIXTURE_COUNTS.get((task, split), FIXTURE_TEST_COUNTS[task])
    assert sorted(p.name for p in (tmp_path / "tfds" / "glue_files").iterdir()) == [glue.glue_task(task).dirname]
    assert capsys.readouterr().out == ""  # a job's stdout is its own (results, JSON lines)


def test_metrics_equal_scipy_and_sklearn_on_known_inputs():
    labels = np.array([1, 1, 1, 0, 0, 0, 1, 0])
    preds = np.array([1, 0, 1, 0, 1, 0, 1, 0])
    tp, tn, fp, fn = 3, 3, 1, 1
    m = glue.compute_metrics(("matthews_corr", "accuracy", "f1"), labels, preds)
    assert m["accuracy"] == pytest.approx(6 / 8)
    assert m["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert m["matthews_corr"] == pytest.approx((tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    y = np.array([0.0, 1.0, 2.5, 4.0, 5.0])
    p = np.array([0.5, 0.7, 3.0, 3.5, 4.9])
    r = glue.compute_metrics(("pearson", "spearman"), y, p)
    assert r["pearson"] == pytest.approx(np.corrcoef(y, p)[0, 1])
    assert r["spearman"] == pytest.approx(1.0)  # same ranks


def test_metrics_equal_sklearn_and_scipy_on_random_inputs():
    """The NumPy metrics against the libraries GLUE's own scripts use: classification exactly (ties, constant
    predictions, boolean predictions, three classes for MCC included), correlations to the last bits (150 random cases)."""
    import warnings

    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    warnings.simplefilter("ignore")  # scikit-learn warns on a single class, scipy on constant input
    rng = np.random.default_rng(0)
    for trial in range(150):
        n = int(rng.integers(2, 40))
        labels, preds = rng.integers(0, 2, n), rng.integers(0, 2, n)
        preds = np.zeros(n, int) if trial % 5 == 0 else preds.astype(bool) if trial % 5 == 1 else preds
        assert glue._accuracy(labels, preds) == accuracy_score(labels, preds)
        assert glue._f1(labels, preds) == f1_score(labels, preds, zero_division=0.0)
        assert glue._matthews(labels, preds) == matthews_corrcoef(labels, preds)
        three = rng.integers(0, 3, n), rng.integers(0, 3, n)
        assert glue._matthews(*three) == pytest.approx(matthews_corrcoef(*three), abs=1e-12)
        y, x = (rng.normal(size=n).round(int(rng.integers(0, 3))) for _ in range(2))  # rounding makes ties
        x = np.ones(n) if trial % 7 == 0 else x
        expected = pearsonr(x, y)[0], spearmanr(x, y)[0]
        got = glue._pearson(y, x), glue._spearman(y, x)
        assert np.allclose(got, expected, rtol=0, atol=1e-12, equal_nan=True), (got, expected)


def _race_tar(tmp_path):
    path = tmp_path / "race.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for split, level, name, n_q in (("dev", "middle", "1.txt", 2), ("dev", "high", "2.txt", 1), ("train", "high", "3.txt", 3)):
            doc = {"id": name, "article": f"article {name}", "questions": [f"q{i}?" for i in range(n_q)],
                   "options": [["a", "b", "c", "d"]] * n_q, "answers": ["ABCD"[i % 4] for i in range(n_q)]}
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(f"race/{split}/{level}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_race_reader(tmp_path):
    path = _race_tar(tmp_path)
    dev = load_race(path, "validation")
    assert [(e["level"], e["label"], e["idx"]) for e in dev] == [("middle", 0, 0), ("middle", 1, 1), ("high", 0, 2)]
    assert dev[0]["options"] == ["a", "b", "c", "d"] and dev[0]["article"] == "article 1.txt"
    assert len(load_race(path, "train", "high")) == 3
    assert load_race(path, "dev", ("middle",))[-1]["question"] == "q1?"
    with pytest.raises(FileNotFoundError, match="no RACE passages"):
        load_race(path, "test")
    with pytest.raises(ValueError, match="unknown RACE level"):
        load_race(path, "dev", "low")
    (tmp_path / "cut.tar.gz").write_bytes(path.read_bytes()[:60])  # a download cut short
    (tmp_path / "notes.txt").write_text("not an archive")
    for bad in ("cut.tar.gz", "notes.txt"):
        for read in (lambda f: load_race(f, "dev"), check_archive):  # check_archive: the paper pipeline's, up front
            with pytest.raises(DataError, match=rf"{bad}: not a readable RACE archive \(race.tar.gz or its unpacked "
                                                r"folder\)"):
                read(tmp_path / bad)
    check_archive(path)  # a good one passes


def test_a_runs_race_splits_come_from_one_reading_of_the_archive(tmp_path):
    """Each split read race.tar.gz whole (1 to 2.3 s each for the real one: ~4 s at every RACE run's start); the
    task's reader reads it once for the splits it names, and hands each out once."""
    path = _race_tar(tmp_path)
    read = race_reader(path, ("train", "validation", "test"))
    dev = read("validation")
    path.rename(tmp_path / "moved.tar.gz")  # the archive is not read again for the other splits
    assert len(read("train")) == 3 and dev == load_race(tmp_path / "moved.tar.gz", "validation")
    with pytest.raises(FileNotFoundError, match="no RACE passages for split 'test'"):  # none in the archive: said
        read("test")  # when it is read, not while the others were
    with pytest.raises(FileNotFoundError, match="race.tar.gz: RACE archive .* not found"):  # handed out: read again
        read("validation")
    path.write_bytes((tmp_path / "moved.tar.gz").read_bytes())
    assert read("train") == load_race(path, "train")  # again, and from the archive as it is now
    with pytest.raises(ConfigError, match="RACE split 'dev' was not asked for: train, validation, test"):
        read("dev")
    with pytest.raises(ConfigError, match="unknown RACE split 'val'"):
        race_reader(path, ("train", "val"))


def test_a_race_level_named_twice_is_refused_from_the_archive_and_the_folder(tmp_path):
    """race_levels=high,high read the unpacked folder's high passages twice (two copies of every example) and the
    archive's once: the same data made two training sets. Refused in one line, from either, and by the task before
    any passage is read."""
    from gpt1_jax.config import FinetuneConfig
    from gpt1_jax.data.tasks import make_task
    from gpt1_jax.errors import ConfigError

    path = _race_tar(tmp_path)
    with tarfile.open(path) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    message = "race_levels=high,middle,high names RACE level(s) ['high'] more than once: name each level once " \
              "(known: middle, high)"
    for where in (path, tmp_path / "unpacked"):
        with pytest.raises(ConfigError) as e:
            load_race(where, "dev", "high,middle,high")
        assert str(e.value) == message
        assert len(load_race(where, "dev", "high,middle")) == len(load_race(where, "dev")) == 3
    with pytest.raises(ConfigError, match=r"names RACE level\(s\) \['high'\] more than once"):
        make_task(FinetuneConfig(task="race", race_levels="high,high"), str(tmp_path / "nowhere"))


def test_an_stsb_score_off_its_scale_names_file_and_line(tmp_path):
    """STS-B's labels are similarities from 0 to 5: a 7.5 (or nan) trained and was scored with exit 0, where a CoLA or
    RTE label outside its classes is refused by file and line."""
    head = "index\tsentence1\tsentence2\tscore\n"
    for bad in ("7.5", "-0.5", "nan"):
        path = _write(tmp_path, "STS-B", "train.tsv", f"{head}0\ta\tb\t5.000\n1\ta\tb\t{bad}\n")
        with pytest.raises(DataError) as e:
            list(glue.read_tsv(path, "stsb", "train"))
        assert str(e.value) == f"{path}:3: label {bad!r} is not a STS-B score in [0, 5]"
    dev = _write(tmp_path, "STS-B", "dev.tsv", f"{head}0\ta\tb\t0\n1\ta\tb\t5\n2\ta\tb\t2.4\n")
    assert [ex["label"] for ex in glue.read_tsv(dev, "stsb", "validation")] == [0.0, 5.0, 2.4]


def test_glue_tables_paper_average_is_over_the_tasks_run_as_ours_is():
    """The average row put Table 5's 74.7 (the paper's 8 tasks) beside our average over the 5 small tasks: a level
    compared over other tasks. The paper's first metrics over the same tasks give 71.4, and 74.7 over its 8."""
    from experiments.glue.glue_table import paper_average

    assert paper_average(["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"]) == "74.7"
    assert paper_average(["cola", "sst2", "mrpc", "stsb", "rte"]) == "71.4"
    assert paper_average(["rte", "wnli"]) == "56.0" and paper_average(["wnli"]) == "–"  # no paper number for WNLI
