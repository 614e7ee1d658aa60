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
    assert [bucket_len(n, 64) for n in (1, 16, 17, 32, 33, 40, 63, 64, 90)] == [16, 16, 32, 32, 48, 48, 64, 64, 64]
    assert [bucket_len(n, 256) for n in (100, 241, 250, 256, 300)] == [112, 256, 256, 256, 256]
    assert max_segment_len(512) == 254


def test_the_held_out_slice_is_the_same_for_every_seed_and_never_trained_on():
    import numpy as np

    from gpt1_jax.config import FinetuneConfig
    from gpt1_jax.data.tasks import subset, train_rows

    runs = {seed: train_rows(1000, FinetuneConfig(seed=seed, holdout_fraction=0.1, max_train_examples=500))
            for seed in (0, 1, 2)}
    held = runs[0][1]
    assert held.size == 100 and all(np.array_equal(h, held) for _, h in runs.values())
    for rows, _ in runs.values():
        assert rows.size == 500 and not set(rows) & set(held) and np.all(np.diff(rows) > 0)
    assert not np.array_equal(runs[0][0], runs[1][0])  # the seed draws the training subset
    everything, none = train_rows(1000, FinetuneConfig(holdout_fraction=0.1))
    assert everything.size == 900 and set(everything) | set(held) == set(range(1000))
    # without a held-out slice, the subset is the one runs drew before the option existed
    plain, none = train_rows(1000, FinetuneConfig(seed=3, max_train_examples=200))
    assert none.size == 0 and np.array_equal(plain, subset(1000, 200, 3))
