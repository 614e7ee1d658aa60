"""Pre-training data pipeline: sources, token cache, packing, split, per-process iterator, resume."""

from __future__ import annotations
import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from gpt1_jax.data import BatchIterator, open_source
from gpt1_jax.errors import DataError
from tests.support.data import _windows, write_corpus


def test_gzip_that_is_not_gzip_is_one_line(tmp_path: Path) -> None:
    """Random bytes named .txt.gz, or a gzip cut short: DataError naming the file, from the library and
    as the CLI's last line (exit 2), with no tokenizer, token cache or checkpoint written."""
    import subprocess
    import sys

    _, good = write_corpus(tmp_path / "c")
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(good.read_bytes()[:-12])
    noise = tmp_path / "x.txt.gz"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    for path in (noise, cut):
        with pytest.raises(DataError, match=rf"{path.name}: not readable gzip data"):
            list(open_source(str(path)).documents())
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "gpt1_jax.cli", "pretrain", "--workdir", str(tmp_path / "run"),
                           "--config", "tiny", "--steps", "1", "--data", str(noise)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1 and "x.txt.gz: not readable gzip data" in done.stderr, done.stderr[-3000:]
    written = [p for p in (tmp_path / "run").rglob("*")] + [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert not written, written


# --- real multi-process ----------------------------------------------------------------------------
_WORKER = r"""
import hashlib, sys
import numpy as np
import jax
jax.config.update("jax_num_cpu_devices", 2)
pid, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                           heartbeat_timeout_seconds=10, shutdown_timeout_seconds=10, initialization_timeout=60)
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from gpt1_jax.data import BatchIterator, PackedWindows
w = PackedWindows(np.random.default_rng(0).integers(0, 300, 50 * 8 + 1).astype(np.uint16), 8)
it = BatchIterator(w, np.arange(len(w)), 8, seed=5)  # process index/count from jax
assert it.local_batch_size == 4
sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
for _ in range(3):
    g = {k: jax.make_array_from_process_local_data(sharding, v) for k, v in next(it).items()}
    full = multihost_utils.process_allgather(g["inputs"], tiled=True)
    print("BATCH", hashlib.sha256(np.ascontiguousarray(full, dtype=np.int32).tobytes()).hexdigest(), flush=True)
"""


def test_two_real_processes_build_the_global_batch(tmp_path: Path) -> None:
    import hashlib
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    procs = [
        subprocess.Popen([sys.executable, str(script), str(i), str(port)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for i in range(2)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]

    w = _windows()
    one = BatchIterator(w, np.arange(len(w)), 8, seed=5, process_index=0, process_count=1)
    expected = [hashlib.sha256(next(one)["inputs"].astype(np.int32).tobytes()).hexdigest() for _ in range(3)]
    for out in outs:
        assert [line.split()[1] for line in out.splitlines() if line.startswith("BATCH")] == expected


# --- encodings and long documents --------------------------------------------------------------------
def test_utf16_and_utf32_files_say_so_and_how_to_convert(tmp_path: Path) -> None:
    """What Windows Notepad saves as "Unicode" (UTF-16 with a byte-order mark) must not be told to convert from
    latin-1: that turns it into NUL-filled mojibake that trains. NULs in UTF-8 are refused for the same reason; a
    UTF-8 byte-order mark is dropped; real latin-1 keeps its hint. One line each, also as the CLI's (exit 2)."""
    import codecs
    import subprocess
    import sys

    text = "héllo world\n\nsecond paragraph\n"
    cases = {
        "le.txt": (codecs.BOM_UTF16_LE + text.encode("utf-16-le"), "UTF-16 text (little-endian, it starts with a "
                   "byte-order mark); convert it to UTF-8 first: iconv -f UTF-16 -t UTF-8 {p} > {d}/le.utf8.txt"),
        "be.txt": (codecs.BOM_UTF16_BE + text.encode("utf-16-be"), "UTF-16 text (big-endian, it starts"),
        "le32.txt": (codecs.BOM_UTF32_LE + text.encode("utf-32-le"), "UTF-32 text (little-endian, it starts"),
        "be32.txt": (codecs.BOM_UTF32_BE + text.encode("utf-32-be"), "UTF-32 text (big-endian, it starts"),
        "nobom.txt": (text.encode("utf-16-le") * 4, "UTF-16 text (little-endian, without a byte-order mark: every "
                      "other byte is NUL); convert it to UTF-8 first: iconv -f UTF-16LE -t UTF-8 {p} > "
                      "{d}/nobom.utf8.txt"),
        "nobom_be.txt": (text.encode("utf-16-be") * 4, "UTF-16 text (big-endian, without a byte-order mark"),
        "c.txt.gz": (gzip.compress(codecs.BOM_UTF16_LE + text.encode("utf-16-le")),
                     "convert it to UTF-8 first: gunzip -c {p} | iconv -f UTF-16 -t UTF-8 > {d}/c.utf8.txt"),
        # what the old hint (iconv -f latin1 -t utf-8) made of a UTF-16 file
        "mojibake.txt": ((codecs.BOM_UTF16_LE + text.encode("utf-16-le")).decode("latin-1").encode(),
                         "UTF-16 text converted to UTF-8 as if it were latin-1"),
        "nul.txt": (b"fine line\n\nvalid utf-8 b\x00u\x00t NULs\n", "NUL bytes on line 3, which no text has"),
        "latin1.txt": (text.encode("latin-1"), "not UTF-8 text (byte 0xe9 on line 1); convert it first, e.g. "
                       "iconv -f latin1 -t utf-8"),
        # the line it names was that of the last line read before the decoder's chunk: line 1, or hundreds early
        "line3.txt": (b"good line\n\nbad \xff byte here\n", "not UTF-8 text (byte 0xff on line 3)"),
        "far.txt": (b"".join(b"plain ascii line %d\r\n" % i for i in range(1, 15000)) + b"bad \xe9 here\r\n",
                    "not UTF-8 text (byte 0xe9 on line 15000)"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(DataError) as err:
            list(open_source(str(path)).documents())
        said = str(err.value)
        assert said.startswith(f"{path}: ") and message.format(p=path, d=tmp_path) in said and "\n" not in said, said
        assert ("latin1" in said) == (name in ("latin1.txt", "line3.txt", "far.txt")), said

    bom = tmp_path / "bom.txt"
    bom.write_bytes(codecs.BOM_UTF8 + text.encode())
    assert list(open_source(str(bom)).documents()) == ["héllo world", "second paragraph"]

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "gpt1_jax.cli", "pretrain", "--workdir", str(tmp_path / "run"),
                           "--config", "tiny", "--steps", "1", "--data", str(tmp_path / "le.txt")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1, done.stderr[-3000:]
    said = f"gpt1-jax pretrain: error: {tmp_path / 'le.txt'}: UTF-16 text (little-endian, it starts with a byte-order"
    assert done.stderr.startswith(said), done.stderr
    assert not (tmp_path / "run").exists()


def test_the_data_bench_command_refuses_a_missing_source_in_one_line(tmp_path: Path) -> None:
    """`python -m gpt1_jax.data --source nope.txt` ended in a FileNotFoundError traceback."""
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "gpt1_jax.data", "--workdir", str(tmp_path / "w"), "--source",
                           str(tmp_path / "nope.txt")], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"python -m gpt1_jax.data: error: text source '{tmp_path / 'nope.txt'}': no such file or directory"], done.stderr
