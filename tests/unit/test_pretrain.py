"""`gpt1-jax pretrain`'s refusals of bad input, in process: one line, nothing written (the runs themselves:
tests/e2e/test_pretrain.py)."""

import pytest

from tests.support.pretrain import cache  # noqa: F401 (a pytest fixture)


@pytest.mark.parametrize(
    "make_input, flags, message",
    [
        (lambda d: (d / "empty.txt").write_text(""), ["--data", "{d}/empty.txt"], "has no documents"),
        (lambda d: (d / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin1")), ["--data", "{d}/latin1.txt"],
         "latin1.txt: not UTF-8 text (byte 0xe9 on line 1)"),
        (None, ["--seq-len", "100"], "data.seq_len=100 is longer than the model's context model.n_positions=64"),
        (None, ["--set", "nope=1"], "unknown config key 'nope'"),
        (None, ["--set", "optim.lr=fast"], "optim.lr must be float, got 'fast'"),
        (None, ["--mesh", "data=3"], "mesh data=3,fsdp=1,tensor=1 needs 3 devices, have 8"),
        (None, ["--mesh", "data=8", "--batch-size", "12"], "global batch 12 is not divisible by data x fsdp = 8"),
        (None, ["--mesh", "tensor=8"], "mesh tensor=8 does not divide h_0/attn/c_attn/bias's heads dimension (4)"),
        (None, ["--set", "model.dtype=bfloat16", "--set", "model.attention=cudnn"],
         "model.attention='cudnn' needs an NVIDIA GPU, and this run's devices are cpu"),
        (None, ["--set", "model.attention=dot_product"], "model.attention='dot_product' has no attention dropout"),
    ],
    ids=["empty-corpus", "not-utf8", "seq-len-too-long", "unknown-key", "bad-value", "bad-mesh", "bad-batch", "tensor-over-heads",
         "cudnn-on-cpu", "fused-attention-with-dropout"],
)
def test_bad_input_is_one_clear_line(tmp_path, cache, capsys, make_input, flags, message):
    from gpt1_jax import cli

    if make_input:
        make_input(tmp_path)
    workdir = tmp_path / "run"
    argv = ["pretrain", "--config", "tiny", "--workdir", str(workdir), "--set", f"data.cache_dir={cache}"]
    status = cli.main(argv + [f.format(d=tmp_path) for f in flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1].startswith("gpt1-jax pretrain: error: ") and message in err[-1], err
    assert not workdir.exists()  # no tokenizer either: checked before the corpus is read, or trained on nothing


def test_no_validation_windows_with_evaluations_on_is_refused_before_training(tmp_path, cache, capsys):
    """It was found at the first evaluation, after the steps before it had trained (and left a run behind)."""
    from gpt1_jax import cli

    workdir = tmp_path / "run"
    status = cli.main(["pretrain", "--config", "tiny", "--workdir", str(workdir), "--set", f"data.cache_dir={cache}",
                       "--set", "data.val_fraction=0", "--set", "eval_every=2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1].startswith("gpt1-jax pretrain: error: eval_every=2 evaluates on validation windows, "
                                              "and data.val_fraction=0.0 leaves none of this corpus's "), err
    assert err[-1].endswith("set data.val_fraction above 0, or eval_every=0")
    assert sorted(p.name for p in workdir.iterdir()) == ["tokenizer.json", "tokenizer.meta.json"]  # no run claimed


def test_a_corpus_smaller_than_a_batch_leaves_no_run_folder(tmp_path, cache, capsys, vocab_dir):
    """The batch-size refusal came after the checkpoints' folder was made (tests/e2e/test_pretrain.py: a
    one-window corpus with evaluations on)."""
    from gpt1_jax import cli

    corpus = tmp_path / "one.txt"
    corpus.write_text(" ".join(["the"] * 100) + "\n")
    workdir = tmp_path / "run"
    status = cli.main(["pretrain", "--config", "tiny", "--workdir", str(workdir), "--data", str(corpus),
                       "--set", f"data.cache_dir={cache}", "--set", f"data.tokenizer={vocab_dir}", "--set", "eval_every=0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and "only 1 window of 65 tokens, fewer than global_batch_size 8" in err[-1], err
    assert not (workdir / "checkpoints").exists() and not (workdir / "config.yaml").exists()


def test_a_held_out_share_that_leaves_less_than_a_batch_names_val_fraction(tmp_path, cache, capsys):
    """It said "only 2 windows ... use a bigger corpus" of a corpus of 1,800 windows."""
    from gpt1_jax import cli

    workdir = tmp_path / "run"
    status = cli.main(["pretrain", "--config", "tiny", "--workdir", str(workdir), "--set", f"data.cache_dir={cache}",
                       "--set", "data.val_fraction=0.999", "--set", "eval_every=0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1].startswith("gpt1-jax pretrain: error: data.val_fraction=0.999 holds out "), err
    assert err[-1].endswith("fewer than one batch of 8: lower data.val_fraction")
    assert not (workdir / "run.json").exists()


def test_numbers_json_cannot_hold_are_written_as_text_and_perplexity_is_not_capped():
    """evaluate printed a bare NaN (strict JSON readers refuse it) and capped perplexity at exp(50) = 5.2e21 for a
    loss of 2,496; results.json held bare NaN for an undefined STS-B correlation."""
    import json
    import math

    from gpt1_jax.evaluate import perplexity
    from gpt1_jax.metrics import json_safe

    safe = json_safe({"loss": math.nan, "scores": [math.inf, 1.5], "dev": {"pearson": -math.inf}, "n": 3})
    assert json.loads(json.dumps(safe, allow_nan=False)) == {"loss": "nan", "scores": ["inf", 1.5],
                                                              "dev": {"pearson": "-inf"}, "n": 3}
    assert perplexity(2496.7) == math.inf and perplexity(114.0) == pytest.approx(math.exp(114.0))


def test_metrics_records_without_an_integer_step_are_left_out_as_lines_that_are_not_records(tmp_path):
    """`{"step": "a"}` in metrics.jsonl stopped the resume with a TypeError (the step compared with the resumed one);
    `{"loss": 1.5}` stopped the loss plot with a KeyError. Both are left out, as a torn line or `null` is."""
    import json

    from gpt1_jax.metrics import MetricsWriter, read_metrics

    good = [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0}, {"step": 3, "loss": 3.0}]
    bad = ['{"step": "a", "loss": "b"}', '{"loss": 1.5}', '{"step": null}', '{"step": true}', '{"step": 1.5}',
           "null", "[1]", '{"step": 3, "lo']
    lines = [json.dumps(r) for r in good[:2]] + bad[:4] + [json.dumps(good[2])] + bad[4:]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert read_metrics(tmp_path) == good
    MetricsWriter(tmp_path, resume_step=2, tracker=None).close()
    assert read_metrics(tmp_path) == good[:2]


def test_the_loss_plot_of_a_run_with_no_finite_loss_says_so_without_a_warning(tmp_path):
    """A run that diverged at step 1 (model.init_std=1e30) printed matplotlib's "No artists with labels found to put
    in legend" warning between its lines."""
    import warnings

    from gpt1_jax.metrics import plot_losses

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": "nan"}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_losses(tmp_path).is_file()


def test_a_resume_that_moves_the_learning_rate_says_so():
    """Resuming a finished 30-step run for 50 stretched its cosine over 50 steps: the lr jumped x100 at step 31 and
    only "resuming at step 30" was said."""
    from gpt1_jax.config import OptimConfig
    from gpt1_jax.pretrain import schedule_change

    ran = OptimConfig(lr=3e-3, schedule="warmup_cosine", warmup_steps=5, total_steps=30)
    note = schedule_change(ran, OptimConfig(lr=3e-3, schedule="warmup_cosine", warmup_steps=5, total_steps=50), 30)
    assert note.startswith("the learning-rate schedule changed (optim.total_steps 30 -> 50): step 31 trains at lr 0.00")
    assert note.endswith("repeat the run's --steps (30) to keep it")
    assert schedule_change(ran, ran, 12) is None
    constant = OptimConfig(lr=3e-3, schedule="warmup_constant", warmup_steps=5, total_steps=30)
    assert schedule_change(constant, OptimConfig(lr=3e-3, schedule="warmup_constant", warmup_steps=5, total_steps=50),
                           30) is None  # the span moved, the lr did not


def test_a_resume_with_an_optimizer_of_another_state_is_one_line(tmp_path):
    """`--set optim.name=lion` (or clip_norm=0) on a gpt1_adam run's resume was a 6 KB orbax traceback."""
    import dataclasses

    from gpt1_jax.config import PretrainConfig, preset
    from gpt1_jax.errors import WorkdirError
    from gpt1_jax.pretrain import check_same_optimizer_state

    ran = preset(PretrainConfig, "tiny")
    now = dataclasses.replace(ran, steps=80, optim=dataclasses.replace(ran.optim, name="lion", total_steps=80))
    with pytest.raises(WorkdirError, match=r"holds checkpoints of another optimizer \(optim.name='gpt1_adam' there, "
                                           r"'lion' now\): repeat the run's optimizer settings to resume it"):
        check_same_optimizer_state(tmp_path, now, ran)
    with pytest.raises(WorkdirError, match=r"optim.clip_norm=1.0 there, 0.0 now"):
        check_same_optimizer_state(tmp_path, dataclasses.replace(ran, optim=dataclasses.replace(ran.optim, clip_norm=0.0)),
                                   ran)
    # another lr or decay keeps the state's layout: resumable
    check_same_optimizer_state(tmp_path, dataclasses.replace(ran, optim=dataclasses.replace(ran.optim, lr=1e-4)), ran)


def test_a_resume_may_store_its_optimizer_state_in_another_dtype(tmp_path):
    """orbax casts a checkpoint's arrays to the state it restores into: the memory lever stays resumable."""
    import dataclasses

    from gpt1_jax.config import PretrainConfig, preset
    from gpt1_jax.pretrain import check_same_optimizer_state

    ran = preset(PretrainConfig, "tiny")
    check_same_optimizer_state(tmp_path, dataclasses.replace(ran, optim=dataclasses.replace(ran.optim, state_dtype="bfloat16")),
                               ran)


def test_evaluate_scores_a_run_on_a_mesh_the_devices_here_hold(capsys):
    """A run trained with --simulate-devices 8 --mesh data=2,fsdp=2,tensor=2 could not be evaluated on 1 device
    ("needs 8 devices, have 1"), and evaluate refuses --mesh: its refusal promised this fallback."""
    from gpt1_jax.config import MeshConfig, parse_mesh
    from gpt1_jax.evaluate import mesh_here

    fits = parse_mesh("data=2,fsdp=2,tensor=2")  # the suite's 8 fake devices hold it
    assert mesh_here(fits) is fits and capsys.readouterr().err == ""
    big = MeshConfig(data=4, fsdp=4, rules=(("vocab", None),))
    assert mesh_here(big) == MeshConfig(rules=(("vocab", None),))
    assert "evaluating data-parallel over the 8 devices here (the run's mesh data=4,fsdp=4,tensor=1 does not fit" \
        in capsys.readouterr().err


def test_a_resume_that_changes_how_the_model_runs_says_so():
    """model.dtype, remat or optim.state_dtype changed on resume were taken without a word (fine-tuning refuses
    them; pre-training resumes exactly), and config.yaml then recorded them for every step."""
    import dataclasses

    from gpt1_jax.config import PretrainConfig, preset
    from gpt1_jax.pretrain import runtime_change

    ran = preset(PretrainConfig, "tiny")
    assert runtime_change(ran, ran, 6) is None
    now = dataclasses.replace(ran, accum_steps=2, model=dataclasses.replace(ran.model, dtype="bfloat16"))
    assert runtime_change(ran, now, 6) == ("resuming with other run-time settings than the run's (model.dtype float32 "
                                           "-> bfloat16, accum_steps 1 -> 2): steps 7 on run with them, and config.yaml "
                                           "records them")


def test_evaluate_pads_a_batch_the_devices_cannot_split_and_scores_it_as_one_device_does():
    """The data-parallel fallback over every device here could not split the run's batch: `gpt1-jax evaluate
    --simulate-devices 3` on a batch-8 run ended 'global batch 8 is not divisible by data x fsdp = 3'. Rows of
    weight 0 pad it; the loss and token count are one device's."""
    import jax
    import numpy as np

    from gpt1_jax.config import MeshConfig, OptimConfig, model_preset
    from gpt1_jax.evaluate import lm_loss, split_rows
    from gpt1_jax.model import init_params
    from gpt1_jax.step import lm_trainer

    model = model_preset("tiny")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.vocab_size, (2, 3, 17), dtype=np.int32)  # 2 batches of 3 rows: 3 % 8 != 0
    weights = np.ones((2, 3, 16), np.float32)
    weights[1, 2] = 0  # pad_last's row in the last batch
    batches = [{"inputs": t[:, :-1], "targets": t[:, 1:], "weights": w} for t, w in zip(tokens, weights)]
    params = init_params(model, 0)
    every, one = (lm_trainer(model, OptimConfig(), MeshConfig(), devices=d) for d in (None, jax.devices()[:1]))
    assert (split_rows(every.mesh, 3), split_rows(every.mesh, 16), split_rows(one.mesh, 3)) == (8, 16, 3)
    loss, tokens_scored = lm_loss(every, every.place_params(params), batches)
    assert tokens_scored == 5 * 16
    assert loss == pytest.approx(lm_loss(one, one.place_params(params), batches)[0], rel=1e-6)
