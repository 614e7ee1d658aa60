"""--tracker wandb for real, offline (WANDB_MODE=offline: no network, no mock): a tiny pre-training run logs its
steps and its config into a local W&B run under the workdir, the run resumed for more steps logs into the
same W&B run id, and steps a resumed run replays are kept. --tracker none writes metrics.jsonl alone.
(TensorBoard, the default: tests/e2e/test_pretrain.py.)"""

import dataclasses
import json
import struct
import time
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError

from gpt1_jax import pretrain
from gpt1_jax.config import PretrainConfig, preset
from gpt1_jax.errors import ConfigError
from gpt1_jax.metrics import read_metrics
from tests.support.pretrain import cache  # noqa: F401 (a pytest fixture)


pytest.importorskip("wandb", reason="the [wandb] extra (README's test command installs it)")


def _config(cache, steps: int, tracker: str) -> PretrainConfig:
    base = preset(PretrainConfig, "tiny")
    return dataclasses.replace(base, steps=steps, eval_every=0, checkpoint_every=0, tracker=tracker,
                               data=dataclasses.replace(base.data, cache_dir=str(cache)))


def _records(path: Path) -> list:
    """The protobuf records of a W&B transaction log (run-<id>.wandb): LevelDB's log format, 32 KiB blocks of
    chunks behind a 7-byte (crc32, length, kind) header, after the file's own 7-byte ':W&B' header."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, chunk, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if (left := 32768 - pos % 32768) < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        chunk, pos = chunk + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or its last chunk
            out.append(pb.Record.FromString(chunk))
            chunk = b""
    return out


def _written(path: Path, timeout: float = 30.0) -> list:
    """The records of a .wandb file once W&B has written its last (`exit`): its service process writes the file
    after run.finish() returns (2 of 15 closes in a row left only the 7-byte header, whole 2 s later)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = _records(path)
        except DecodeError:  # a record cut where the writer is
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def _logged(run_dir: Path) -> tuple[dict, list[dict]]:
    """(the run's config, its history rows in the order logged) from its .wandb file."""
    config, rows = {}, []
    for r in _written(next(run_dir.glob("run-*.wandb"))):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            config = {i.key: json.loads(i.value_json) for i in r.run.config.update}
        elif kind == "history":
            rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item})
    return config, rows


def _losses(rows: list[dict]) -> dict[int, float]:
    """step -> loss: the run's step is the metric train/step (gpt1_jax/tracker.py); W&B's _step counts rows."""
    return {r["train/step"]: r["loss"] for r in rows if "loss" in r}


def test_wandb_offline_logs_steps_and_config_and_resumes_the_same_run(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    workdir = tmp_path / "run"
    assert pretrain.run(_config(cache, 3, "wandb"), workdir).finished
    run_id = (workdir / "wandb_run_id").read_text().strip()
    first = list((workdir / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(first) == 1 and not (workdir / "tensorboard").exists()
    config, rows = _logged(first[0])
    losses = _losses(rows)
    assert config["steps"] == 3 and config["tracker"] == "wandb" and config["model"]["d_model"] == 64
    assert losses == {r["step"]: r["loss"] for r in read_metrics(workdir) if "loss" in r} and sorted(losses) == [1, 2, 3]

    assert pretrain.run(_config(cache, 5, "wandb"), workdir).finished  # resumed from step 3's checkpoint
    runs = sorted((workdir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)  # one W&B run, logged in two sessions
    second = next(r for r in runs if r != first[0])
    assert sorted(_losses(_logged(second)[1])) == [4, 5]


def test_wandb_keeps_the_steps_a_resumed_run_replays(tmp_path, monkeypatch):
    """A run stopped after step 5 and resumed from step 3's checkpoint logs steps 4 and 5 again. Logged as W&B's own
    step (log(step=)), which only goes up, W&B dropped them: "Tried to log to step 4 that is less than the current
    step 5 ... this data will be ignored". Offline W&B learns no step of an earlier session (online, the server's
    last step is where a resumed run starts), so one session replays here: steps 1-5, then 4-6."""
    from gpt1_jax.tracker import open_tracker

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    logged = [(1, 6.0), (2, 5.0), (3, 4.0), (4, 3.0), (5, 2.0), (4, 3.5), (5, 2.5), (6, 2.0)]
    tracker = open_tracker("wandb", tmp_path, preset(PretrainConfig, "tiny"), 0)
    for step, loss in logged:
        tracker.log(step, {"loss": loss, "lr": float("nan")})  # a value that is not finite is left out, as before
    tracker.close()
    rows = _logged(next((tmp_path / "wandb").glob("offline-run-*")))[1]
    assert [(r["train/step"], r["loss"]) for r in rows] == logged and not any("lr" in r for r in rows)
    assert [r["_step"] for r in rows] == list(range(len(logged)))  # W&B's own step counts the rows


def test_no_tracker_writes_metrics_jsonl_alone(tmp_path, cache):
    assert pretrain.run(_config(cache, 2, "none"), tmp_path / "run").finished
    assert not (tmp_path / "run" / "tensorboard").exists() and not (tmp_path / "run" / "wandb").exists()
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "loss" in r] == [1, 2]


def test_wandb_that_cannot_start_is_one_line_and_the_run_is_not_claimed(tmp_path, cache, monkeypatch):
    """Online without a login, W&B refuses at once (no network needed). That used to end in wandb's 39-line traceback
    after config.yaml, run.json and wandb_run_id were written, then in this line after the BPE and the token cache
    were made (minutes on a large corpus); now before any data is read (tracker.check_tracker)."""
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_API_KEY", "WANDB_DIR", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no W&B settings of this machine's user
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / ".config" / "wandb"))
    import wandb

    wandb.teardown()  # W&B keeps its settings per process: the offline test's mode would be read again
    workdir = tmp_path / "run"
    try:
        with pytest.raises(ConfigError, match=r"^tracker=wandb could not start a W&B run: No API key configured\..* "
                                              r"\(or log offline: WANDB_MODE=offline; or --tracker tensorboard\)$"):
            pretrain.run(_config(cache, 2, "wandb"), workdir)
    finally:
        wandb.teardown()  # nor this test's online mode by a later one
    assert not workdir.exists()  # no BPE trained, no token cache read, nothing claimed


def test_a_bad_wandb_setting_is_one_line(tmp_path, cache, monkeypatch):
    """WANDB_MODE=banana ended in pydantic's ValidationError traceback (a ValueError, not one of wandb's errors)."""
    monkeypatch.setenv("WANDB_MODE", "banana")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    wandb.teardown()
    try:
        with pytest.raises(ConfigError, match=r"^tracker=wandb could not start a W&B run: .*WANDB_MODE=offline"):
            pretrain.run(_config(cache, 2, "wandb"), tmp_path / "run")
    finally:
        wandb.teardown()


def test_tensorboard_events_reach_the_disk_at_each_checkpoint(tmp_path):
    """The writer buffered them: a run killed after a checkpoint and resumed from it lost, in TensorBoard, every step
    between the last flush and the checkpoint (steps 16-20 and a validation point), which metrics.jsonl kept."""
    from gpt1_jax.metrics import MetricsWriter
    from gpt1_jax.tracker import open_tracker

    writer = MetricsWriter(tmp_path, tracker=open_tracker("tensorboard", tmp_path, preset(PretrainConfig, "tiny"), 0))
    events = lambda: sum(p.stat().st_size for p in (tmp_path / "tensorboard").iterdir())
    before = events()
    writer.write(1, loss=3.0, lr=1e-3)
    assert events() == before  # buffered
    writer.flush()  # what the loop does after each save
    assert events() > before
    writer.close()
