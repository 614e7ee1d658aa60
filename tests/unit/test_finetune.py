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
    assert cli.main(argv + ["--init", "none", "--config", "tiny", "--set", "model.dtype=bfloat16",
                            "--set", "model.attention=cudnn"]) == 2
    assert "'cudnn' needs an NVIDIA GPU" in capsys.readouterr().err
    assert cli.main(argv + ["--init", "none", "--config", "tiny", "--set", "model.param_dtype=float16"]) == 2
    assert "model.param_dtype=float16 cannot train with optim.name=gpt1_adam" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()  # refused before the task's files are read or anything is written


def test_settings_finetuning_would_drop_are_refused(tmp_path, data_dir, tokenizer, capsys):
    """An architecture field for a model folder that records its own (scratch: too), and the schedule's span and
    warmup, which fine-tuning derives: each ran with exit 0 and config.yaml recorded what had not run (a warmup
    above the placeholder total was refused as "exceeds total_steps=1")."""
    hf, _, _ = _hf_dir(tmp_path, tokenizer)
    argv = ["finetune", "--task", "cola", "--workdir", str(tmp_path / "w"), "--data-dir", str(data_dir),
            "--tfds-dir", str(tmp_path / "tfds"), "--no-progress"]
    for init in (str(hf), f"scratch:{hf}"):
        assert cli.main(argv + ["--init", init, "--set", "model.resid_dropout=0.2", "--set", "model.n_layers=3"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{hf} records its architecture; only run-time fields" in err[0] \
            and err[0].endswith("not 'n_layers'"), err
    for key in ("optim.warmup_steps=100", "optim.total_steps=50"):
        assert cli.main(argv + ["--init", "none", "--set", key]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{key.partition('=')[0]} is derived in fine-tuning" in err[0], err
    # --set won over --task: `--task cola --set task=rte` fine-tuned RTE, exit 0
    assert cli.main(argv + ["--init", "none", "--set", "task=rte"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "gpt1-jax finetune: error: --set task=...: the task is --task's; give it there"]
    assert not (tmp_path / "w").exists()


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


def test_group_by_length_keeps_every_example_once_and_pads_less():
    import numpy as np

    from experiments.paper.cost import padded_tokens
    from gpt1_jax.data.tasks import GROUP_BATCHES, epoch_order

    rng = np.random.default_rng(7)
    lengths = rng.integers(3, 250, 4 * GROUP_BATCHES * 8 + 5)  # 4 groups of 50 batches of 8, and a short batch
    seqs = [[[0] * n] for n in lengths]
    plain = epoch_order(lengths, 8, seed=1, epoch=1, group_by_length=False)
    assert np.array_equal(plain, np.random.default_rng([1, 1]).permutation(len(lengths)))  # the order runs had
    grouped = epoch_order(lengths, 8, seed=1, epoch=1, group_by_length=True)
    assert np.array_equal(np.sort(grouped), np.arange(len(lengths)))
    assert np.array_equal(grouped, epoch_order(lengths, 8, seed=1, epoch=1, group_by_length=True))  # resumable
    assert not np.array_equal(grouped, epoch_order(lengths, 8, seed=1, epoch=2, group_by_length=True))
    assert not np.array_equal(grouped, epoch_order(lengths, 8, seed=2, epoch=1, group_by_length=True))
    # each whole batch comes from one group of the plain permutation; the short batch is last
    group_of = np.empty(len(lengths), int)
    group_of[plain] = np.arange(len(lengths)) // (GROUP_BATCHES * 8)
    batches = grouped[: len(lengths) // 8 * 8].reshape(-1, 8)
    assert all(len(set(group_of[b])) == 1 for b in batches)
    assert set(grouped[-5:]) <= set(plain[4 * GROUP_BATCHES * 8:])
    # the batches are shuffled, not visited group by group
    assert group_of[batches[:, 0]].tolist() != sorted(group_of[batches[:, 0]].tolist())
    assert padded_tokens(seqs, 8, 256, grouped) < 0.7 * padded_tokens(seqs, 8, 256, plain)


def test_grouped_batches_resume_at_their_step():
    """EpochBatches with group_by_length: a restored position serves the batches the run would have served."""
    import numpy as np

    from gpt1_jax.data.layout import Markers
    from gpt1_jax.data.tasks import EpochBatches, Encoded

    rng = np.random.default_rng(3)
    enc = Encoded([[[1] + [5] * int(n) + [2]] for n in rng.integers(1, 40, 70)], np.zeros(70, np.int32), [{}] * 70)
    make = lambda: EpochBatches(enc, 8, seed=4, n_ctx=64, markers=Markers(1, 2, 3), group_by_length=True)
    whole = make()
    served = [next(whole) for _ in range(20)]  # 9 batches an epoch: into the third epoch
    resumed = make()
    resumed.restore({"step": 11})
    for want in served[11:]:
        got = next(resumed)
        assert all(np.array_equal(got[k], want[k]) for k in want)
    widths = [b["tokens"].shape[-1] for b in served[:8]]
    assert len(set(widths)) > 2  # the batches of one epoch pad to different lengths


def test_a_pretrained_models_head_size_decides_whether_cudnn_can_run(tmp_path, data_dir, tokenizer, capsys, monkeypatch):
    """On a GPU, model.attention=cudnn needs a head size that is a multiple of 8: the pre-trained model's
    (here 20), not the preset's. Refused in one line before anything is written. The GPU is the check's
    `backend` argument: this machine has none."""
    import dataclasses
    import functools

    from gpt1_jax import finetune, save_pretrained
    from gpt1_jax.attention import check_runnable
    from gpt1_jax.config import model_preset
    from gpt1_jax.model import init_params

    model = dataclasses.replace(model_preset("tiny"), vocab_size=tokenizer.base_vocab_size, d_model=40, n_heads=2,
                                d_mlp=160)
    assert model.head_dim == 20 and model_preset("tiny").head_dim % 8 == 0
    hf = save_pretrained(model, init_params(model, 7), tmp_path / "hf")
    tokenizer.save(hf / "tokenizer.json")
    monkeypatch.setattr(finetune, "check_attention", functools.partial(check_runnable, backend="gpu"))
    argv = ["finetune", "--task", "cola", "--workdir", str(tmp_path / "w"), "--data-dir", str(data_dir),
            "--tfds-dir", str(tmp_path / "tfds"), "--no-progress", "--init", str(hf),
            "--set", "model.dtype=bfloat16", "--set", "model.attention=cudnn", "--set", "model.attn_dropout=0"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a head dim that is a multiple of 8 up to 128, got 20" in err[0], err
    assert not (tmp_path / "w").exists()


def test_cut_examples_are_counted_from_the_layout_race_included(tmp_path, tokenizer):
    """The count checked each text against a segment's length: a RACE article of fewer tokens than a segment keeps
    can still give way to its question (692 counted of 752 cut on RACE's test split at n_ctx 512)."""
    from gpt1_jax.config import FinetuneConfig
    from gpt1_jax.data.tasks import _race_task, encode_split

    race = _race_task(FinetuneConfig(task="race"), str(tmp_path / "race.tar.gz"))  # its layout only: nothing is read
    keep = max_segment_len(64)  # 30 tokens a segment
    words = lambda n: " ".join(["cat"] * n)  # noqa: E731
    examples = [{"article": words(a), "question": words(q), "options": [words(2)] * 4, "label": 0}
                for a, q in ((20, 5), (28, 5), (40, 1))]  # fits; each text fits but together they do not; too long
    enc = encode_split(race, examples, tokenizer, 64, of=10)
    assert (enc.cut, enc.of) == (2, 10) and keep == 30


def test_step_is_refused_where_init_reads_no_weights(tmp_path, capsys):
    """`finetune --init none --step 5` ran and recorded "none step 5" as the run's source."""
    assert cli.main(["finetune", "--task", "cola", "--init", "none", "--step", "5", "--workdir", str(tmp_path / "r")]) == 2
    assert "--step picks a checkpoint of the --init run, and --init none reads no weights" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_init_layers_beyond_the_init_models_depth_is_refused(tmp_path, data_dir, tokenizer, capsys):
    """init_layers above the --init model's layer count ran as -1 (all kept: `transplant`) with exit 0, so a Figure 2
    sweep point with a typo trained the full transfer. Refused in one line once the weights are read, before anything
    is written; the model's own depth is all of it and stays allowed."""
    hf, model, params = _hf_dir(tmp_path, tokenizer)
    tokenizer.save(hf / "tokenizer.json")
    argv = ["finetune", "--task", "cola", "--workdir", str(tmp_path / "w"), "--data-dir", str(data_dir),
            "--tfds-dir", str(tmp_path / "tfds"), "--no-progress", "--init", str(hf)]
    assert cli.main(argv + ["--set", f"init_layers={model.n_layers + 3}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(f"error: init_layers={model.n_layers + 3} exceeds the {model.n_layers} "
                                             f"layers of --init {hf}: give 0 to {model.n_layers} (-1: all)"), err
    assert not (tmp_path / "w").exists()
    from gpt1_jax.finetune import Source, check_init_layers

    for n in (-1, 0, model.n_layers):
        check_init_layers(n, Source(str(hf), model, params))
    check_init_layers(model.n_layers + 3, Source("scratch", model, None))  # no weights: nothing is transplanted
