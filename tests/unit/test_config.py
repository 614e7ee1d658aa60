"""The names config.py validates against agree with the registries beside their code (config.py is imported
by the modules holding those registries, so it keeps the names itself; these tests keep the two as one); and
values from `--set` and YAML files become the fields' types, or one error naming the key."""

import flax.linen as nn
import pytest
from jax.sharding import PartitionSpec as P

from gpt1_jax import config
from gpt1_jax.config import (PretrainConfig, apply_overrides, check_pretrain_schedule, load_yaml, preset, resolve,
                             save_yaml)
from gpt1_jax.errors import ConfigError
from gpt1_jax.data.glue import GLUE_TASKS
from gpt1_jax.optim import OPTIMIZERS, SCHEDULES
from gpt1_jax.sharding import DEFAULT_RULES, logical_rules


def test_optimizer_and_schedule_names_are_the_registries():
    assert config.OPTIMIZER_NAMES == tuple(OPTIMIZERS)
    assert config.SCHEDULE_NAMES == tuple(SCHEDULES)


def test_logical_axes_are_the_rules_table():
    assert config.LOGICAL_AXES == tuple(name for name, _ in DEFAULT_RULES)


def test_task_names_are_glue_then_race():
    assert config.TASK_NAMES == (*GLUE_TASKS, "race")


def test_list_and_pair_fields_are_typed_from_set_and_yaml():
    base = preset(PretrainConfig, "tiny")
    assert apply_overrides(base, ["keep_steps=[2, 4]"]).keep_steps == (2, 4)
    rules = apply_overrides(base, ["mesh.rules={vocab: null, embed: fsdp}"]).mesh.rules
    assert rules == (("vocab", None), ("embed", "fsdp"))


@pytest.mark.parametrize("override, message", [
    ("keep_steps=abc", "keep_steps must be a list, got 'abc'"),
    ("keep_steps=5", "keep_steps must be a list, got 5"),
    ("keep_steps=[1, x]", "keep_steps[1] must be int, got 'x'"),
    ("keep_steps=[0, 4]", "keep_steps must list steps >= 1, got [0, 4]"),
    ("mesh.rules=abc", "mesh.rules must be a list, got 'abc'"),
    ("mesh.rules=[[vocab]]", "mesh.rules[0] must hold 2 items, got ['vocab']"),
    ("data.vocab_size=-5", "data.vocab_size must be between 1 and 4,194,304, got -5"),
    ("data.vocab_size=99999999999", "data.vocab_size must be between 1 and 4,194,304"),  # was a Rust allocation abort
    ("seed=18446744073709551617", "seed must be between 0 and 2147483647, got 18446744073709551617"),
    ("seed=3000000000", "seed must be between 0 and 2147483647"),  # the step's int32: an OverflowError at step 1
    ("data.split_seed=-1", "data.split_seed must be between 0 and 2147483647"),
    ("optim.lr=nan", "optim.lr must be a number, got nan"),
    ("optim.lr=1e400", "optim.lr must be a finite number > 0, got inf"),
    # these four trained (and learnt nothing, or NaN) with exit 0
    ("optim.lr=0", "optim.lr must be a finite number > 0, got 0"),
    ("optim.eps=0", "optim.eps must be a finite number > 0, got 0"),
    ("optim.adafactor_decay_rate=2", "optim.adafactor_decay_rate must lie in (0, 1], got 2"),
    ("optim.sf_weight_lr_power=-5", "optim.sf_weight_lr_power must be a finite number >= 0, got -5"),
    # the same rule whether the value is 0 or below (it said ">= 0" for -1e-3), and each names its field and value
    ("optim.lr=-1e-3", "optim.lr must be a finite number > 0, got -0.001"),
    ("optim.eps=-1", "optim.eps must be a finite number > 0, got -1.0"),
    ("optim.weight_decay=-1", "optim.weight_decay must be a finite number >= 0, got -1.0"),
    ("optim.warmup_steps=-5", "optim.warmup_steps must be >= 0, got -5"),
    ("optim.muon_ns_steps=0", "optim.muon_ns_steps must be >= 1, got 0"),
    ("optim.muon_adam_lr_ratio=-1", "optim.muon_adam_lr_ratio must be a finite number >= 0, got -1.0"),
    ("optim.momentum=1", "optim.momentum must lie in [0, 1), got 1.0"),
    ("optim.adafactor_momentum=-0.5", "optim.adafactor_momentum must lie in [0, 1), got -0.5"),
    ("optim.b2=1", "optim.b2 must lie in [0, 1), got 1.0"),
    # trained with the paper's b2 while config.yaml recorded 0.99
    ("optim.b2=0.99", "optim.name=gpt1_adam is the paper's Adam, b1 0.9, b2 0.999, eps 1e-08, got b1 0.9, b2 0.99"),
    ("model.layer_norm_eps=-1", "model.layer_norm_eps must be > 0, got -1"),
    ("model.init_std=-5", "model.init_std must be >= 0, got -5"),
    ("keep_steps=[1,", "override 'keep_steps=[1,': the value is not valid YAML"),
    ("model.d_modle=3", "unknown config key 'model.d_modle' (did you mean model.d_model?); known: attention, "),
    # the same name in its section, and a section misspelt: the key it most likely meant is named
    ("lr=1e-3", "unknown config key 'lr' (did you mean optim.lr?); known: accum_steps, "),
    ("optimizer.lr=1e-3", "unknown config key 'optimizer.lr' (did you mean optim.lr?); known: accum_steps, "),
    ("nope=1", "unknown config key 'nope'; known: accum_steps, "),  # nothing close: no guess
    # tracebacks where the value was first used, or a folder named 'None'
    ("mesh.rules={vocab: 5}", "mesh.rules[0][1] must be str or tuple or null, got 5"),
    ("mesh.rules={vocab: bogus}", "mesh.rules: unknown mesh axis 'bogus'"),  # was found after the tokenizer was written
    # jax's DuplicateSpecError traceback, after the tokenizer was written
    ("mesh.rules={embed: [data, data]}", "mesh.rules: embed maps to mesh axis 'data' twice (data, data); a dimension"),
    ("mesh.rules={batch: 'fsdp,data, fsdp'}", "mesh.rules: batch maps to mesh axis 'fsdp' twice (fsdp, data, fsdp)"),
    ("steps={[a]: 1}", "override 'steps={[a]: 1}': the value is not valid YAML (a key must be a name, not a list)"),
    ("data.cache_dir=5", "data.cache_dir must be str or null, got 5"),
    ("seed=0x10", "seed must be int, got '0x10'"),
    ("optim.muon_consistent_rms=nan", "optim.muon_consistent_rms must be a number, got nan"),
])
def test_a_bad_value_is_one_error_naming_the_key(override, message):
    """Each of these once ended in a traceback: a ValueError or TypeError where the value was first used."""
    with pytest.raises(ConfigError) as e:
        apply_overrides(preset(PretrainConfig, "tiny"), [override])
    assert str(e.value).startswith(message), str(e.value)


def test_integers_are_decimal_and_null_is_none_for_optional_fields():
    """YAML 1.1 read `--set seed=010` as 8 (and `--seed 010` as 10); `data.cache_dir=None` was the folder 'None'."""
    base = preset(PretrainConfig, "tiny")
    assert apply_overrides(base, ["seed=010"]).seed == 10 and apply_overrides(base, ["steps=1_000"]).steps == 1000
    assert apply_overrides(base, ["data.cache_dir=None"]).data.cache_dir is None
    assert apply_overrides(base, ["data.cache_dir=~"]).data.cache_dir is None
    assert apply_overrides(base, ["data.cache_dir=/tmp/x"]).data.cache_dir == "/tmp/x"


def test_a_saved_config_reads_back_as_it_was_whatever_its_strings_look_like(tmp_path):
    """With integers read as decimal, a corpus named `08` (a string YAML 1.1 writes bare) read back as the int 8:
    the run could not resume ("data.source must be str, got 8")."""
    import dataclasses

    base = preset(PretrainConfig, "tiny")
    for source in ("08", "0_9", "1e3", "+5", "2:3", "null", "yes"):
        config = dataclasses.replace(base, data=dataclasses.replace(base.data, source=source))
        save_yaml(config, tmp_path / "config.yaml")
        assert load_yaml(PretrainConfig, tmp_path / "config.yaml") == config, source


def test_lm_coef_nan_or_inf_is_refused_and_the_task_is_recorded_in_one_spelling():
    """lm_coef=nan trained to "loss is nan at step 1 (lower optim.lr?)", and its folder then refused even the
    same flags (nan != nan); `--task RTE` and `--task rte` were two runs."""
    for value in ("nan", ".inf"):
        with pytest.raises(ConfigError, match="^lm_coef must be a number"):
            apply_overrides(config.FinetuneConfig(), [f"lm_coef={value}"])
    assert config.FinetuneConfig(task="RTE").task == "rte" and config.FinetuneConfig(task="SST-2").task == "sst2"


def test_a_yaml_file_fills_what_it_leaves_out_from_the_jobs_defaults_as_set_does(tmp_path):
    """`model: {n_layers: 1}` in a file gave the full GPT-1 width (the class's defaults) where `--set
    model.n_layers=1` gives the default preset's; `optim: {lr: ...}` gave 2,000 warmup steps, and a fine-tuning
    file the pre-training schedule."""
    path = tmp_path / "a.yaml"
    path.write_text("model:\n  n_layers: 1\noptim:\n  lr: 0.001\nsteps: 40\n")
    from_file = resolve(PretrainConfig, str(path))
    assert from_file == resolve(PretrainConfig, None, overrides=["model.n_layers=1", "optim.lr=0.001", "steps=40"])
    assert (from_file.model.d_model, from_file.optim.warmup_steps) == (PretrainConfig().model.d_model, 30)
    path.write_text("task: rte\noptim:\n  lr: 0.0001\n")
    tuned = resolve(config.FinetuneConfig, str(path))
    assert (tuned.optim.schedule, tuned.optim.lr, tuned.model) == ("warmup_linear", 1e-4, config.FinetuneConfig().model)


def test_a_misspelt_key_in_a_yaml_file_is_named_with_the_one_it_likely_meant(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("model:\n  n_layer: 2\n")
    with pytest.raises(ConfigError) as e:
        resolve(PretrainConfig, str(path))
    assert str(e.value).startswith("unknown config key 'model.n_layer' (did you mean model.n_layers?); known: ")


def test_a_yaml_files_schedule_is_checked_as_set_is_and_a_runs_own_config_passes(tmp_path):
    """A file's optim.total_steps and too long a warmup were replaced without a word where --set is refused."""
    import dataclasses

    from gpt1_jax.pretrain import with_schedule_span

    path = tmp_path / "wu.yaml"
    path.write_text("optim: {lr: 0.003, warmup_steps: 5, total_steps: 500}\nsteps: 6\n")
    with pytest.raises(ConfigError, match=r"optim.total_steps=500 is not its steps \(6\)"):
        check_pretrain_schedule(resolve(PretrainConfig, str(path)), [], str(path))
    path.write_text("optim: {lr: 0.003, warmup_steps: 50}\nsteps: 6\n")
    with pytest.raises(ConfigError, match="^optim.warmup_steps=50 leaves none of the run's 6 steps"):
        check_pretrain_schedule(resolve(PretrainConfig, str(path)), [], str(path))
    ran = with_schedule_span(dataclasses.replace(preset(PretrainConfig, "tiny"), steps=7))  # as a run records it
    save_yaml(ran, tmp_path / "config.yaml")
    again = resolve(PretrainConfig, str(tmp_path / "config.yaml"))
    check_pretrain_schedule(again, [], str(tmp_path / "config.yaml"))
    assert again == ran


def test_a_section_given_whole_by_set_is_merged_as_a_files_is(tmp_path):
    """`--set model={n_layers: 1}` replaced the section with the class's defaults (GPT-1's full width), and
    `--set optim={..., total_steps: 500}` slipped past the schedule check (only `optim` was given)."""
    whole = resolve(PretrainConfig, None, overrides=["model={n_layers: 1}", "optim={lr: 0.002}"])
    assert whole == resolve(PretrainConfig, None, overrides=["model.n_layers=1", "optim.lr=0.002"])
    for given in (["optim={lr: 0.002, total_steps: 500}"], ["optim=total_steps: 500"]):  # flow and block YAML
        with pytest.raises(ConfigError, match="^optim.total_steps is the run's --steps"):
            check_pretrain_schedule(resolve(PretrainConfig, None, overrides=given), given)
    for bad in ("steps=abc", "optim.warmup_steps=[1]"):  # a TypeError traceback where the span was computed
        with pytest.raises(ConfigError, match="must be int"):
            resolve(PretrainConfig, None, overrides=[bad])
    empty = tmp_path / "empty.yaml"
    empty.write_text("model:\n  # n_layers: 2\nsteps: 7\n")  # a section whose every line is commented out
    assert resolve(PretrainConfig, str(empty)) == resolve(PretrainConfig, None, overrides=["steps=7"])


@pytest.mark.parametrize("section", ["model", "optim", "data", "mesh"])
def test_a_null_section_gives_nothing_from_a_file_and_from_set_alike(tmp_path, section):
    """`model: null` in a --config file left the section as it was; `--set model=null` was 'model must be a
    mapping, got None'. Both now leave it as it was (`model:` with its lines commented out is the same null)."""
    file = tmp_path / "null.yaml"
    file.write_text(f"{section}: null\nsteps: 7\n")
    expected = resolve(PretrainConfig, "tiny", overrides=["steps=7"])
    over_preset = resolve(PretrainConfig, "tiny", overrides=[f"{section}=null", "steps=7"])
    assert over_preset == expected and over_preset.model.n_layers == preset(PretrainConfig, "tiny").model.n_layers
    for spelling in ("null", "~", ""):
        assert resolve(PretrainConfig, None, overrides=[f"{section}={spelling}", "steps=7"]) == resolve(PretrainConfig, str(file))
    with pytest.raises(ConfigError, match="^steps must be int, got None"):  # a field, not a section: still refused
        resolve(PretrainConfig, None, overrides=["steps=null"])
    # nor does it count as every field of the section given: the preset's warmup of 5 is the run's to clip
    check_pretrain_schedule(resolve(PretrainConfig, "tiny", overrides=["steps=3", f"{section}=null"]),
                            ["steps=3", f"{section}=null"], str(file))


def test_a_null_field_that_holds_a_mapping_is_not_a_null_section():
    """mesh.rules holds a mapping once --set gave it one: a later `mesh.rules=null` was skipped as a null section is,
    and the run kept {vocab: null} without a word; it is refused as `mesh.rules=null` alone is."""
    with pytest.raises(ConfigError, match="^mesh.rules must be a list, got None"):
        resolve(PretrainConfig, None, overrides=["mesh.rules=null"])
    with pytest.raises(ConfigError, match="^mesh.rules must be a list, got None"):
        resolve(PretrainConfig, None, overrides=["mesh.rules={vocab: null}", "mesh.rules=null"])


def test_a_runs_own_config_counts_as_a_preset_for_the_schedule(tmp_path):
    """Its warmup was clipped to steps - 1 by the run: reused with fewer --steps it was refused as given."""
    import dataclasses

    from gpt1_jax.pretrain import with_schedule_span

    save_yaml(with_schedule_span(dataclasses.replace(preset(PretrainConfig, "small"), steps=10)), tmp_path / "config.yaml")
    spec = str(tmp_path / "config.yaml")
    check_pretrain_schedule(resolve(PretrainConfig, spec, overrides=["steps=5"]), ["steps=5"], spec)


def test_finetuning_refuses_from_a_file_what_it_refuses_from_set(tmp_path, capsys):
    """A hand-written file's optim.total_steps was dropped without a word (and its warmup_steps refused against the
    placeholder total of 1); a fine-tuning run's own config.yaml, derived values and all, reads back as it ran."""
    from gpt1_jax import cli

    for name, optim in (("total", "total_steps: 500"), ("warmup", "warmup_steps: 100")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"task: rte\noptim:\n  {optim}\n")
        assert cli.main(["finetune", "--task", "rte", "--config", str(path), "--init", "none",
                         "--workdir", str(tmp_path / "w")]) == 2
        assert f"optim.{optim.split(':')[0]} is derived in fine-tuning" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
    old = tmp_path / "old.yaml"  # a run's config.yaml from before its guard line: the placeholders, not given
    old.write_text("task: rte\noptim:\n  total_steps: 1\n  warmup_steps: 0\n")
    assert cli.main(["finetune", "--task", "rte", "--config", str(old), "--init", "none", "--workdir", str(tmp_path / "w"),
                     "--data-dir", str(tmp_path / "no-glue")]) == 2
    assert "is derived" not in capsys.readouterr().err
    optim = config.OptimConfig(lr=6.25e-5, schedule="warmup_linear", warmup_steps=0, total_steps=4)
    ran = config.FinetuneConfig(task="rte", optim=optim)
    save_yaml(ran, tmp_path / "config.yaml")
    assert config.hand_written(str(tmp_path / "config.yaml")) == {}
    assert resolve(config.FinetuneConfig, str(tmp_path / "config.yaml")) == ran
    # saved before the guard line, or with it deleted: every field is there, as in no file written by hand
    unguarded = tmp_path / "unguarded.yaml"
    unguarded.write_text((tmp_path / "config.yaml").read_text().split("\n", 1)[1])
    assert config.hand_written(str(unguarded), config.FinetuneConfig) == {}
    assert config.hand_written(str(unguarded))["optim.total_steps"] == 4


def test_config_files_that_are_not_yaml_say_where(tmp_path):
    (tmp_path / "tabs.yaml").write_text("steps: 5\n\tseed: 2\n")
    (tmp_path / "d.yaml").mkdir()
    for name, message in (("tabs.yaml", "is not valid YAML: found character '\\t' that cannot start any token (line 2, "
                                        "column 1)"), ("d.yaml", "is a folder, not a file")):
        with pytest.raises(ConfigError) as e:
            resolve(PretrainConfig, str(tmp_path / name))
        assert str(e.value) == f"config file {tmp_path / name} {message}"


def test_yaml_keeps_start_stop_as_text_and_refuses_a_key_given_twice(tmp_path):
    """YAML 1.1 reads `1:2` as one base-60 number (62): `profile: 1:2` was refused as "must be str, got 62"."""
    assert apply_overrides(preset(PretrainConfig, "tiny"), ["profile=1:2"]).profile == "1:2"
    path = tmp_path / "run.yaml"
    path.write_text("steps: 5\nprofile: 2:3\noptim: {lr: 1e-4, warmup_steps: 10, total_steps: 1_000}\n")
    loaded = load_yaml(PretrainConfig, path)
    assert (loaded.profile, loaded.optim.lr, loaded.optim.warmup_steps, loaded.optim.total_steps) == ("2:3", 1e-4, 10, 1000)
    path.write_text("steps: 5\nsteps: 6\n")
    with pytest.raises(ConfigError, match=f"config file {path} is not valid YAML: the key 'steps' is given twice"):
        load_yaml(PretrainConfig, path)


def test_a_warmup_longer_than_the_presets_total_follows_the_runs_steps():
    """pretrain's schedule spans its steps: `--steps 200 --set optim.warmup_steps=100` on the tiny preset was refused
    as "exceeds total_steps=50", the preset's total that the run replaces anyway."""
    config = apply_overrides(preset(PretrainConfig, "tiny"), ["steps=200", "optim.warmup_steps=100"])
    assert (config.optim.warmup_steps, config.optim.total_steps) == (100, 200)
    short = apply_overrides(preset(PretrainConfig, "tiny"), ["steps=2"])  # shorter than the preset's warmup of 5
    assert (short.optim.warmup_steps, short.steps) == (5, 2)  # the run ends its warmup before step 2 (pretrain.py)
    # What a user sets and the run would silently replace is refused: the total (the run's steps) and a warmup
    # that leaves nothing to decay over (it was clamped to steps - 1, and config.yaml recorded that instead).
    # (in pretrain: bench and plan run no such span)
    for given, message in ((["steps=6", "optim.total_steps=100"], r"^optim.total_steps is the run's --steps in pre-training"),
                           (["steps=6", "optim.warmup_steps=100"], r"^optim.warmup_steps=100 leaves none of the run's 6 "
                                                                   r"steps to decay over \(warmup_cosine\)")):
        config = apply_overrides(preset(PretrainConfig, "tiny"), given)
        with pytest.raises(ConfigError, match=message):
            check_pretrain_schedule(config, given)
    # warmup_constant has nothing to decay, but its warmup would still end a step before the last
    constant = ["steps=6", "optim.schedule=warmup_constant", "optim.warmup_steps=12"]
    with pytest.raises(ConfigError, match=r"^optim.warmup_steps=12 is as long as the run's 6 steps or longer"):
        check_pretrain_schedule(apply_overrides(preset(PretrainConfig, "tiny"), constant), constant)
    fine = ["steps=6", "optim.warmup_steps=4"]  # 5 (steps - 1) is refused now: test_a_warmup_must_leave_a_step_to_decay
    check_pretrain_schedule(apply_overrides(preset(PretrainConfig, "tiny"), fine), fine)


@pytest.mark.parametrize("schedule", ["warmup_cosine", "warmup_linear", "warmup_constant"])
def test_a_warmup_must_leave_a_step_to_decay(schedule):
    """Step k trains at the schedule's value at k - 1 and a decay starts at the peak: `--steps 30 --set
    optim.warmup_steps=29` trained its last step at the peak lr (0.003 in metrics.jsonl), decaying nothing, while 30
    was refused as leaving none to decay over. A decaying schedule's warmup ends two steps before the run now;
    warmup_constant's may still end at the last step (tests/unit/test_optim.py holds the boundary to the schedules)."""
    decays = schedule != "warmup_constant"
    refused, most = (29, 28) if decays else (30, 29)
    given = ["steps=30", f"optim.schedule={schedule}", f"optim.warmup_steps={refused}"]
    what = r"leaves none of the run's 30 steps to decay over" if decays else r"is as long as the run's 30 steps"
    rule = rf"^optim.warmup_steps={refused} {what}.* \({schedule}\): set it to {most} or less$"
    with pytest.raises(ConfigError, match=rule):
        check_pretrain_schedule(resolve(PretrainConfig, "tiny", overrides=given), given)
    fine = ["steps=30", f"optim.schedule={schedule}", f"optim.warmup_steps={most}"]
    check_pretrain_schedule(resolve(PretrainConfig, "tiny", overrides=fine), fine)
    one = ["steps=1", f"optim.schedule={schedule}", "optim.warmup_steps=0"]  # one step: nothing to warm up or decay
    check_pretrain_schedule(resolve(PretrainConfig, "tiny", overrides=one), one)


def test_gpt1_adam_refuses_constants_it_would_not_use_but_a_saved_run_stays_readable(tmp_path):
    """`--set optim.b2=0.99` on gpt1_adam trained with b2 0.999 and config.yaml recorded 0.99; a run saved that way
    before the refusal must still load (sample, evaluate and convert read its config.yaml)."""
    import dataclasses

    with pytest.raises(ConfigError, match="optim.name=gpt1_adam is the paper's Adam"):
        apply_overrides(preset(PretrainConfig, "tiny"), ["optim.b2=0.99"])
    assert apply_overrides(preset(PretrainConfig, "tiny"), ["optim.name=adamw", "optim.b2=0.99"]).optim.b2 == 0.99
    config = preset(PretrainConfig, "tiny")
    old = dataclasses.replace(config, optim=dataclasses.replace(config.optim, b2=0.99))
    save_yaml(old, tmp_path / "config.yaml")
    assert load_yaml(PretrainConfig, tmp_path / "config.yaml").optim.b2 == 0.99
    lion = dataclasses.replace(config, optim=dataclasses.replace(config.optim, name="lion", eps=0.0))  # eps unused
    save_yaml(lion, tmp_path / "lion.yaml")
    assert load_yaml(PretrainConfig, tmp_path / "lion.yaml").optim.eps == 0.0
    # resumed with a setting of their own, as a run's saved config.yaml is (only what is given is checked)
    for saved, b2 in (("config.yaml", 0.99), ("lion.yaml", 0.999)):
        resumed = resolve(PretrainConfig, None, saved=tmp_path / saved, overrides=["optim.lr=1e-4", "optim.clip_norm=0.5"])
        assert (resumed.optim.lr, resumed.optim.b2) == (1e-4, b2)
    # a whole optim mapping is given whole
    with pytest.raises(ConfigError, match="optim.lr must be a finite number > 0, got 0"):
        apply_overrides(preset(PretrainConfig, "tiny"), ["optim={lr: 0, eps: 0, warmup_steps: 0}"])
    with pytest.raises(ConfigError, match="optim.name=gpt1_adam is the paper's Adam"):
        resolve(PretrainConfig, str(tmp_path / "config.yaml"))  # as --config: the user's choice, refused


def test_two_logical_axes_may_share_a_mesh_axis_and_no_array_gets_it_twice():
    """Only one rule naming a mesh axis twice reaches jax's DuplicateSpecError (refused above): flax gives a mesh
    axis to one dimension of an array at most, so embed and mlp both on data leave a [embed, mlp] kernel valid."""
    rules = apply_overrides(preset(PretrainConfig, "tiny"), ["mesh.rules={embed: data, mlp: data}"]).mesh.rules
    assert nn.logical_to_mesh_axes(("embed", "mlp"), logical_rules(rules)) == P(None, "data")


def test_a_yaml_key_that_is_a_list_or_a_mapping_is_one_line_naming_the_place(tmp_path):
    """`? [a, b]` was a TypeError traceback (unhashable type: 'list') from the key-given-twice check."""
    for text, kind, where in (("? [a, b]\n: 1\n", "list", "line 1, column 3"),
                              ("model:\n  ? {x: 1}\n  : 2\n", "mapping", "line 2, column 5")):
        path = tmp_path / "k.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as e:
            resolve(PretrainConfig, str(path))
        assert str(e.value) == f"config file {path} is not valid YAML: a key must be a name, not a {kind} ({where})"


@pytest.mark.parametrize("text", ["", "  \n\n", "# steps: 5\n  # seed: 1\n"], ids=["empty", "blank", "comments"])
def test_an_empty_config_is_one_line_not_the_defaults(tmp_path, text):
    """A run's config.yaml emptied (a full disk, an editor) read as the default config: its resume, sample and
    evaluate then spoke of vocabulary sizes and parameter shapes. A --config file with nothing in it is refused too."""
    run = tmp_path / "run" / "config.yaml"
    run.parent.mkdir()
    run.write_text(text)
    with pytest.raises(ConfigError) as e:
        resolve(PretrainConfig, None, saved=run)
    assert str(e.value) == f"{run} is empty: restore it, or start the run in another folder"
    with pytest.raises(ConfigError, match="is empty: restore it"):
        config.guarded_text(run)  # what `verify` and workdir.read use
    given = tmp_path / "mine.yaml"
    given.write_text(text)
    message = (f"config file {given} is empty: write in it the settings to change (e.g. `seed: 1`), or give --config "
               "a preset (gpt1, small, tiny, ")
    for read in (lambda: resolve(config.FinetuneConfig, str(given)), lambda: config.hand_written(str(given))):
        with pytest.raises(ConfigError) as e:
            read()
        assert str(e.value).startswith(message), str(e.value)


# (optimizer, a field it does not read, a valid value): each trained bit-identically to the run without it, exit 0,
# and config.yaml recorded the value as if it had been used.
UNREAD = [("sgd", "b2", "0.5", "adamw, lion, muon, schedule_free_adamw, lamb"),
          ("adamw", "momentum", "0.1", "sgd, sgd_nesterov"),
          ("lion", "eps", "0.5", "adamw, muon, schedule_free_adamw, lamb"),
          ("gpt1_adam", "muon_beta", "0.1", "muon"),
          ("adamw", "sf_b1", "0.1", "schedule_free_adamw"),
          ("schedule_free_adamw", "b1", "0.5", "adamw, lion, muon, lamb"),
          ("adafactor", "b2", "0.5", "adamw, lion, muon, schedule_free_adamw, lamb"),
          ("muon", "momentum", "0.1", "sgd, sgd_nesterov"),
          ("schedule_free_adamw", "state_dtype", "bfloat16", "gpt1_adam, adamw, lion, adafactor, sgd, sgd_nesterov, "
                                                             "muon, lamb")]


@pytest.mark.parametrize("name, field, value, readers", UNREAD, ids=[f"{n}-{f}" for n, f, _, _ in UNREAD])
def test_a_field_the_optimizer_does_not_read_is_refused_where_given(tmp_path, name, field, value, readers):
    """From --set, a whole `optim={...}` and a YAML file alike, naming the optimizers that do read it; a run saved with
    it (before the refusal) still reads back and resumes, and the run's own config.yaml as --config passes."""
    import dataclasses

    message = (f"optim.{field}={value if field == 'state_dtype' else float(value)} is not read by optim.name={name}, "
               f"only by {readers}: leave it out, or choose one of those")
    for given in ([f"optim.name={name}", f"optim.{field}={value}"], [f"optim={{name: {name}, {field}: {value}}}"]):
        with pytest.raises(ConfigError) as e:
            resolve(PretrainConfig, "tiny", overrides=given)
        assert str(e.value) == message
    path = tmp_path / "mine.yaml"
    path.write_text(f"optim: {{name: {name}, {field}: {value}}}\nsteps: 30\n")
    with pytest.raises(ConfigError) as e:
        resolve(PretrainConfig, str(path))
    assert str(e.value) == message
    path.write_text(f"optim: {{{field}: {value}}}\nsteps: 30\n")  # the file's field, the flags' optimizer
    with pytest.raises(ConfigError) as e:
        resolve(PretrainConfig, str(path), overrides=[f"optim.name={name}"])
    assert str(e.value) == message
    base = preset(PretrainConfig, "tiny")
    saved = dataclasses.replace(base, optim=dataclasses.replace(base.optim, name=name,
                                                                **{field: type(getattr(base.optim, field))(value)}))
    save_yaml(saved, tmp_path / "config.yaml")
    assert resolve(PretrainConfig, None, saved=tmp_path / "config.yaml", overrides=["optim.lr=1e-3"]).optim == \
        dataclasses.replace(saved.optim, lr=1e-3)
    assert resolve(PretrainConfig, str(tmp_path / "config.yaml")) == saved


def test_every_optim_field_is_read_by_some_optimizer_and_the_readers_pass(tmp_path):
    """The table has a row per optimizer and places every OptimConfig field (a new one must say who reads it);
    tests/e2e/test_optim.py holds each row to the builder's updates."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(config.OptimConfig)}
    assert set(config.OPTIMIZER_READS) == set(config.OPTIMIZER_NAMES)
    assert fields == set(config.OPTIM_SHARED).union(*config.OPTIMIZER_READS.values())
    for name, fields_read in config.OPTIMIZER_READS.items():
        values = {"b1": "0.8", "b2": "0.95", "eps": "1e-6", "state_dtype": "bfloat16", "momentum": "0.5",
                  "adafactor_momentum": "0.5", "muon_ns_steps": "3", "sf_weight_lr_power": "1"}
        given = [f"optim.name={name}"] + [f"optim.{f}={values.get(f, '0.5')}" for f in fields_read]
        resolve(PretrainConfig, "tiny", overrides=given)
    # gpt1_adam's pinned constants, given at the paper's values, are the ones it trains with
    resolve(PretrainConfig, "tiny", overrides=["optim.b1=0.9", "optim.b2=0.999", "optim.eps=1e-8"])
    # a file's b2 for the flags' adamw: it was checked against the default gpt1_adam before the flags applied
    (tmp_path / "b2.yaml").write_text("optim: {b2: 0.95}\n")
    assert resolve(PretrainConfig, str(tmp_path / "b2.yaml"), overrides=["optim.name=adamw"]).optim.b2 == 0.95


def test_a_schedule_setting_the_run_would_not_use_is_refused_where_given(tmp_path):
    """`--set optim.schedule=constant --set optim.warmup_steps=10` trained at the peak lr from step 1; schedule-free
    chosen with a decaying schedule (its iterate average stands in for the decay); state_dtype with no first moment."""
    refused = {
        ("optim.schedule=constant", "optim.warmup_steps=10"):
            "optim.warmup_steps=10 is not read by optim.schedule=constant (it trains at the peak lr from the first "
            "step): set optim.schedule=warmup_constant to warm up first",
        ("optim.name=schedule_free_adamw", "optim.schedule=warmup_cosine"):
            "optim.schedule=warmup_cosine decays the lr, which optim.name=schedule_free_adamw does not want (its "
            "average of the iterates stands in for the decay): choose warmup_constant or constant",
        ("optim.name=adafactor", "optim.state_dtype=bfloat16"):
            "optim.state_dtype=bfloat16 is not read by optim.name=adafactor with optim.adafactor_momentum=0 (it "
            "keeps no first moment to store): give adafactor_momentum > 0, or leave it out",
        ("optim.name=sgd", "optim.momentum=0", "optim.state_dtype=bfloat16"):
            "optim.state_dtype=bfloat16 is not read by optim.name=sgd with optim.momentum=0 (",
    }
    for given, message in refused.items():
        with pytest.raises(ConfigError) as e:
            resolve(PretrainConfig, "tiny", overrides=list(given))
        assert str(e.value).startswith(message), str(e.value)
    path = tmp_path / "sf.yaml"
    path.write_text("optim: {name: schedule_free_adamw, schedule: warmup_linear}\n")
    with pytest.raises(ConfigError, match="^optim.schedule=warmup_linear decays the lr"):
        resolve(PretrainConfig, str(path))
    for fine in (["optim.schedule=constant"], ["optim.schedule=constant", "optim.warmup_steps=0"],  # the preset's
                 ["optim.name=schedule_free_adamw", "optim.schedule=warmup_constant"],          # warmup, or none
                 ["optim.name=schedule_free_adamw"],  # the job's schedule (fine-tuning's warmup_linear) stays
                 ["optim.name=adafactor", "optim.adafactor_momentum=0.9", "optim.state_dtype=bfloat16"]):
        resolve(PretrainConfig, "tiny", overrides=fine)


def test_total_steps_below_one_names_its_value():
    with pytest.raises(ConfigError) as e:
        config.from_dict(config.OptimConfig, {"total_steps": 0})
    assert str(e.value) == "optim.total_steps must be >= 1, got 0"


def test_the_cli_refuses_an_unread_field_in_one_line_before_writing_anything(tmp_path, capsys):
    from gpt1_jax import cli

    workdir = tmp_path / "run"
    argv = ["pretrain", "--workdir", str(workdir), "--config", "tiny", "--steps", "30", "--no-progress"]
    assert cli.main(argv + ["--set", "optim.name=sgd", "--set", "optim.b2=0.5"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "gpt1-jax pretrain: error: optim.b2=0.5 is not read by optim.name=sgd, only by adamw, lion, muon, "
        "schedule_free_adamw, lamb: leave it out, or choose one of those"]
    assert not workdir.exists()


def test_a_presets_warmup_cut_to_a_short_run_leaves_its_decay_a_step():
    """with_schedule_span cut a preset's warmup to steps - 1, so a decaying schedule's last step trained at the peak
    lr (step k trains at the schedule's value at k - 1), what check_pretrain_schedule refuses where given."""
    import dataclasses

    from gpt1_jax.optim import make_schedule
    from gpt1_jax.pretrain import with_schedule_span

    tiny = preset(PretrainConfig, "tiny")  # warmup 5, warmup_cosine
    for schedule, warmup in (("warmup_cosine", 4), ("warmup_linear", 4), ("warmup_constant", 5)):
        run = dataclasses.replace(tiny, steps=6, optim=dataclasses.replace(tiny.optim, schedule=schedule))
        optim = with_schedule_span(run).optim
        last = float(make_schedule(optim)(run.steps - 1))  # what step 6 trains at
        assert optim.warmup_steps == warmup
        assert (last < optim.lr) if schedule != "warmup_constant" else last == pytest.approx(optim.lr)
