"""The data pipeline at pod scale: a corpus of BooksCorpus size (~1B tokens) through tokenize-once and the
batch iterator, measured as a pod job meets it. One JSON line at the end.

    python -m experiments.scale.data_bench --out runs/data-bench --tokens 50e6     # a check: minutes
    python -m experiments.scale.data_bench --out runs/data-1b --tokens 1e9         # the record

1. The corpus (generated once into OUT/corpus, reused while its manifest matches): the documents of the
   shared corpus (../shared/data/corpus/english_mixed.txt.gz beside the repo root), every pass in a fresh
   seeded shuffle, repeated until the estimated token count reaches --tokens, written as --files gzip
   files. Honest about what it is: real English text, repeated (~1B tokens is ~80 passes over it), so
   its vocabulary is the shared corpus's; tokenisation speed depends on the words, not on their novelty.
2. Tokenisation into a fresh OUT/cache through the tokenize-once path (gpt1_jax/data/tokens.py), with
   the paper's tokenizer (OpenAI's vocabulary, ../shared/data/gpt1_vocab): tokens/s, cache bytes on disk,
   and this process's resident memory sampled every 0.5 s against the tokens written so far (at 10%,
   50% and 100% of the work, and the maximum): flat means bounded by the chunk size, not the corpus.
3. Batch assembly: the real BatchIterator (gpt1_jax/data/pipeline.py) at the 117M shape, global batch
   64 x 512, this host's share with --processes hosts; tokens/s per host against what one chip's step
   consumes: --chip-tokens-per-s, or the 117M model's FLOPs per token at --mfu of --chip's peak.
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("data_bench.py: error: run it from the repository root as: "
          "python -m experiments.scale.data_bench ...", file=sys.stderr)
    sys.exit(2)

import gzip
import json
import os
import random
import shutil
import threading
import time
from pathlib import Path

from experiments import harness
from gpt1_jax.arguments import at_least, number_at_least
from gpt1_jax.config import MODEL_PRESETS
from gpt1_jax.data.bench import benchmark_iterator
from gpt1_jax.data.pipeline import BatchIterator, PackedWindows, split_windows
from gpt1_jax.data.sources import open_source
from gpt1_jax.data.tokens import encode_documents, eod_id, token_dtype, tokenize_to_cache, tokenizer_for
from gpt1_jax.flops import ACCELERATOR_PEAK_FLOPS, cpu_flags, flops_per_token
from gpt1_jax.metrics import Bar

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
MANIFEST = "manifest.json"
SAMPLE_DOCS = 5000  # documents tokenised to estimate tokens per character


# --- 1. the corpus ---------------------------------------------------------------------------------
def tokens_per_char(docs: list[str], tokenizer) -> float:
    sample = docs[:: max(1, len(docs) // SAMPLE_DOCS)]
    dtype, sep = token_dtype(tokenizer.vocab_size), eod_id(tokenizer)
    n_tokens = sum(arr.size for arr, _ in encode_documents(sample, tokenizer, dtype, sep))
    return n_tokens / sum(len(d) + 2 for d in sample)  # +2: the blank line between documents


def generate_corpus(out: Path, docs: list[str], target_chars: int, n_files: int, seed: int) -> int:
    """Shuffled passes over `docs` until `target_chars`, dealt to `n_files` gzip files; returns chars written."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # Level 1: writing ~4 GB at level 6 would take longer than tokenising it; reading costs the same.
    files = [gzip.open(tmp / f"part-{i:05d}.txt.gz", "wt", encoding="utf-8", compresslevel=1) for i in range(n_files)]
    written, passes, rng = 0, 0, random.Random(seed)
    with Bar(total=target_chars, unit="char", unit_scale=True, desc="writing corpus") as bar:
        while written < target_chars:
            order = list(range(len(docs)))
            rng.shuffle(order)
            for j, i in enumerate(order):
                files[j % n_files].write(docs[i] + "\n\n")
                written += len(docs[i]) + 2
                # the last document goes past the target, and a bar past its total drops its % and its bar
                bar.total = max(target_chars, written)
                bar.update(len(docs[i]) + 2)
                if written >= target_chars:
                    break
            passes += 1
    for f in files:
        f.close()
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # last: a corpus folder that exists is complete
    return written


def corpus(args, tokenizer) -> dict:
    """OUT/corpus, generated unless a complete one for the same request is there."""
    folder = args.out / "corpus"
    request = {"source": str(args.source), "tokens": int(args.tokens), "files": args.files, "seed": args.seed,
               "tokenizer_vocab": tokenizer.vocab_size}
    manifest = folder / MANIFEST
    if manifest.is_file() and json.loads(manifest.read_text())["request"] == request:
        return {**json.loads(manifest.read_text()), "reused": True}
    t0 = time.perf_counter()
    docs = list(open_source(str(args.source)).documents())
    rate = tokens_per_char(docs, tokenizer)
    chars = generate_corpus(folder, docs, int(args.tokens / rate), args.files, args.seed)
    info = {"request": request, "source_documents": len(docs), "source_chars": sum(len(d) + 2 for d in docs),
            "tokens_per_char": round(rate, 5), "chars": chars,
            "bytes_on_disk": sum(p.stat().st_size for p in folder.iterdir()),
            "seconds": round(time.perf_counter() - t0, 1)}
    manifest.write_text(json.dumps(info, indent=1))
    return {**info, "reused": False}


# --- 2. tokenisation, with resident memory against progress ---------------------------------------
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class MemorySampler:
    """(tokens written so far, RSS) every `every` s, reading the size of the cache's temporary stream."""

    def __init__(self, cache_dir: Path, itemsize: int, every: float = 0.5):
        self.cache_dir, self.itemsize, self.every = cache_dir, itemsize, every
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tokens_done(self) -> int:
        sizes = [p.stat().st_size for p in self.cache_dir.glob(".tmp-tokens-*/tokens.bin") if p.exists()]
        return max(sizes, default=0) // self.itemsize

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.samples.append((self._tokens_done(), rss_bytes()))
            except OSError:  # the temporary stream renamed away between glob and stat
                pass

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def at_fraction(self, fraction: float, total: int) -> int | None:
        """RSS at the first sample with at least `fraction` of `total` tokens written (100%: the last sample
        before the stream became the cache, as the sampler only sees the temporary file grow)."""
        seen = max((done for done, _ in self.samples), default=0)
        return next((rss for done, rss in self.samples if done and done >= min(fraction * total, seen)), None)


def tokenize(args, source, tokenizer) -> tuple[dict, object]:
    cache_dir = args.out / "cache"
    if not args.reuse_cache:
        shutil.rmtree(cache_dir, ignore_errors=True)  # a measurement of tokenising, not of a cache hit
    mib = lambda b: None if b is None else round(b / 2**20, 1)
    rss_before, load_before, t0, c0 = rss_bytes(), os.getloadavg()[0], time.perf_counter(), os.times()
    with MemorySampler(cache_dir, token_dtype(tokenizer.vocab_size).itemsize) as mem:
        stream = tokenize_to_cache(source, tokenizer, cache_dir, progress=True)
    wall, c1 = time.perf_counter() - t0, os.times()
    n = len(stream)
    rss = [r for _, r in mem.samples] or [rss_bytes()]
    info = {
        "from_cache": stream.from_cache, "tokens": n, "documents": stream.meta["n_docs"],
        "seconds": round(wall, 1), "cpu_seconds": round(c1.user - c0.user + c1.system - c0.system, 1),
        "tokens_per_s": round(n / wall), "cache_bytes": sum(p.stat().st_size for p in stream.path.iterdir()),
        "rss_mib_before": mib(rss_before),
        "rss_mib_at": {f"{int(f * 100)}%": mib(mem.at_fraction(f, n)) for f in (0.1, 0.5, 1.0)},
        "rss_mib_max": mib(max(rss)), "rss_samples": len(mem.samples),
        # Load average (1 min) before and after: on a shared machine tokens/s is per free core, not per core.
        "cores": os.cpu_count(), "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    return info, stream


# --- 3. batch assembly against a chip's appetite ---------------------------------------------------
def chip_tokens_per_s(args) -> tuple[float, str]:
    if args.chip_tokens_per_s is not None:
        return args.chip_tokens_per_s, "given (--chip-tokens-per-s)"
    per_token = flops_per_token(MODEL_PRESETS["gpt1"], args.seq_len)
    peak = ACCELERATOR_PEAK_FLOPS[args.chip]
    return peak * args.mfu / per_token, (f"117M: {per_token:.3g} FLOPs/token at {args.mfu:.0%} MFU of "
                                         f"{args.chip}'s {peak:.3g} FLOP/s")


def batches(args, stream) -> dict:
    windows = PackedWindows(stream.tokens, args.seq_len)
    train, _ = split_windows(len(windows), 0.01)
    it = BatchIterator(windows, train, args.batch_size, process_index=0, process_count=args.processes)
    result = benchmark_iterator(it, args.batches)
    need, why = chip_tokens_per_s(args)
    chips = result["tokens_per_s"] / need
    return {**result, "processes": args.processes, "chip_tokens_per_s": round(need), "chip_estimate": why,
            "chips_fed_per_host": round(chips, 1), "keeps_up_with_4_chips_per_host": chips >= 4}


def main(argv=None) -> None:
    ap = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the corpus and its cache (e.g. runs/data-1b)")
    ap.add_argument("--tokens", type=number_at_least(1.0), default=50e6, help="corpus size in tokens (1e9: BooksCorpus size)")
    ap.add_argument("--source", type=Path, default=SHARED / "corpus" / "english_mixed.txt.gz")
    ap.add_argument("--tokenizer", default=str(SHARED / "gpt1_vocab"), help="tokenizer .json or OpenAI vocab folder")
    ap.add_argument("--files", type=at_least(1), default=16, help="corpus files")
    ap.add_argument("--seed", type=int, default=0, help="shuffles of the passes")
    ap.add_argument("--reuse-cache", action="store_true", help="keep OUT/cache (skips measuring tokenisation)")
    ap.add_argument("--seq-len", type=at_least(1), default=512)
    ap.add_argument("--batch-size", type=at_least(1), default=64, help="global batch (117M: 64)")
    ap.add_argument("--processes", type=at_least(1), default=1, help="hosts sharing the global batch (this host: 1/N of it)")
    ap.add_argument("--batches", type=at_least(1), default=200, help="batches timed")
    ap.add_argument("--chip", default="TPU v4", choices=sorted(ACCELERATOR_PEAK_FLOPS))
    ap.add_argument("--mfu", type=number_at_least(0.0, above=True), default=0.5,
                    help="the step's MFU on --chip (an estimate)")
    ap.add_argument("--chip-tokens-per-s", type=number_at_least(0.0, above=True), default=None,
                    help="one chip's step rate, e.g. from a plan")
    args = ap.parse_args(argv)

    tokenizer = tokenizer_for(open_source(str(args.source)), args.out, tokenizer=args.tokenizer)
    corpus_info = corpus(args, tokenizer)
    source = open_source(str(args.out / "corpus"))
    tokenize_info, stream = tokenize(args, source, tokenizer)
    print(json.dumps({"corpus": corpus_info, "tokenize": tokenize_info, "batches": batches(args, stream),
                      "cpu_flags": cpu_flags()}), flush=True)


if __name__ == "__main__":
    harness.leave(harness.main(main, PROG))
