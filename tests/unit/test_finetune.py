"""Fine-tuning's checks before any training: bad --init sources are one line; sequence-length buckets.
The runs themselves: tests/e2e/test_finetune.py."""


from gpt1_jax import cli
from gpt1_jax.data.layout import max_segment_len
from gpt1_jax.data.tasks import bucket_len
from tests.support.finetune import _hf_dir, data_dir, tokenizer  # noqa: F401 (pytest fixtures)


def test_init_errors(tmp_path, data_dir, tokenizer, capsys):
    hf, _, _ = _hf_dir(tmp_path, tokenizer)
    argv = ["finetune", "--task", "cola", "--workdir", str(tmp_path / "w"), "--data-dir", str(data_dir),
            "--tfds-dir", str(tmp_path / "tfds"), "--no-progress"]
    assert cli.main(argv + ["--init", str(hf)]) == 2
    assert "no tokenizer" in capsys.readouterr().err
    assert cli.main(argv + ["--init", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert cli.main(argv + ["--init", "none", "--task", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'nope'" in err and len(err.strip().splitlines()) == 1
    assert cli.main(argv + ["--init", "none", "--config", "tiny", "--batch-size", "6"]) == 2  # 8 devices
    assert "not divisible" in capsys.readouterr().err


def test_bucket_len():
    assert [bucket_len(n, 64) for n in (1, 16, 17, 40, 63, 64)] == [16, 16, 32, 64, 64, 64]
    assert max_segment_len(512) == 254
