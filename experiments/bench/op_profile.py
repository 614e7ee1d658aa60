"""Where one compiled train step's time goes, op by op: a jax.profiler trace of the step grouped by kind.

    python -m experiments.bench.op_profile --config small --batch 16 --seq 128
    python -m experiments.bench.op_profile --config experiments/paper/pretrain_4ep.yaml --devices 2

XLA:CPU runs the step as thunks (one per top-level HLO instruction: a fusion, a dot, a copy, ...). Many
run asynchronously on its thread pool, several at once: a thunk's span runs from its start to the
"end: NAME" event the runtime logs when its work is done (but for a stale one, logged by a queued share of
the work that the launching thread had already done), and while k thunks run together each is
charged 1/k of that time, so the groups' seconds add up to the time some thunk was running ("busy").
Each thunk is put in one group by what its HLO holds: the jaxpr path in the instructions' metadata
(`h_0/ln_1/...`, `attn/Dropout_0/...`) and their opcodes. Prints one JSON line per group (seconds per
step, share of the step, thunks per step) and a summary: the step's wall time under the profiler, the
busy time, the time no thunk was running ("idle": dispatch, waiting, host work), the thunks per step,
the step's temporary bytes, the page faults and kernel CPU time per step, whether glibc's huge pages
were on, and the CPU flags. Run from a command line it re-executes itself under glibc's huge pages, as
`gpt1-jax bench` and the training verbs do (gpt1_jax/hugepages.py; `GPT1_JAX_HUGE_PAGES=off` for plain
pages). `--trace-dir` keeps the trace for Perfetto or TensorBoard.

`--products` adds one line per kind of matrix product before the summary: the thunk that runs it (`ynn_fusion`:
YNNPACK; a bare `dot`: Eigen; `onednn_*`, `xnn_fusion`), its operand and result shapes, how many a step runs, their
GFLOP, their spans (start to end, whatever ran beside them) and the rate over those spans, and their time-sliced
seconds: a product slower in the step than alone shows here (experiments/bench/README.md, a fifth session).
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("op_profile.py: error: run it from the repository root as: "
          "python -m experiments.bench.op_profile ...", file=sys.stderr)
    sys.exit(2)

import bisect
import collections
import dataclasses
import gzip
import json
import math
import os
import re
import resource
import tempfile
import time
from pathlib import Path

import jax

from experiments import harness
from gpt1_jax import flops, hugepages, sizing
from gpt1_jax.bench import kernel_per_step, seeded_batches
from gpt1_jax.cli import simulate_devices
from gpt1_jax.config import PretrainConfig, resolve
from gpt1_jax.errors import ConfigError
from gpt1_jax.sharding import make_mesh
from gpt1_jax.step import check_batch_size, lm_batch_spec

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

# The groups, in the order a thunk is tested against them: the first that matches names it.
GROUPS = (
    "matmul_lm_head",       # the tied output layer (GPT1._head) and its two gradients
    "matmul_attention",     # q·k and p·v in the attention core, forward and backward
    "matmul_projection",    # c_attn, c_proj, c_fc and their gradients
    "dropout_bits",         # threefry draws and the keep masks made from them
    "attention_softmax",    # scale, causal mask, softmax and its gradient
    "layer_norm",
    "gelu",
    "cross_entropy",        # log-softmax over the vocabulary, the target pick, its gradient
    "embedding",            # token and position gathers, their scatter-add gradients
    "optimizer",            # the update, gradient norm and clipping, the schedule
    "copy_transpose_convert",
    "other",
)
_ATTENTION_PRODUCTS = ("bthk,bshk->bhts", "bhts,bshk->bthk")
_RNG_OPS = {"xor", "shift-right-logical", "shift-left", "rng-bit-generator"}
_COPY_OPS = {"copy", "transpose", "convert", "bitcast", "bitcast-convert", "reshape", "broadcast", "slice",
             "concatenate", "dynamic-slice", "dynamic-update-slice", "pad", "tuple", "get-tuple-element"}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][a-z0-9\-]*)\(")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|called_computations)=\{?%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_RESULT_DIMS = re.compile(r"=\s*\w+\[([\d,]*)\]")
_DOT = re.compile(r"\sdot\(%?([\w.\-]+),\s*%?([\w.\-]+)\).*?lhs_contracting_dims=\{([\d,]*)\}")


@dataclasses.dataclass
class Instruction:
    name: str
    opcode: str
    op_name: str
    calls: list[str]
    batched: bool  # a dot with batch dimensions: in this model, only the attention core's products
    dims: tuple[int, ...] = ()  # the result's shape (an array result's; () for a tuple)
    dot: tuple[str, str, tuple[int, ...]] | None = None  # a dot's (lhs, rhs, lhs contracting dims)


def parse_hlo(text: str) -> dict[str, list[Instruction]]:
    """{computation name: its instructions}, from HLO text."""
    computations: dict[str, list[Instruction]] = {}
    current = None
    for line in text.splitlines():
        header = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if header and not line.startswith(" "):
            current = computations.setdefault(header.group(1), [])
            continue
        if current is None or line.startswith("}"):
            continue
        m = _INSTRUCTION.match(line)
        if m:
            op_name = _OP_NAME.search(line)
            dims = _RESULT_DIMS.search(line)
            dot = _DOT.search(line) if m.group(2) == "dot" else None
            current.append(Instruction(m.group(1), m.group(2), op_name.group(1) if op_name else "",
                                       _CALLS.findall(line), "lhs_batch_dims=" in line,
                                       tuple(int(d) for d in dims.group(1).split(",") if d) if dims else (),
                                       (dot.group(1), dot.group(2), tuple(int(d) for d in dot.group(3).split(",") if d))
                                       if dot else None))
    return computations


def group_of(instructions: list[Instruction], vocab: int | None = None) -> str:
    """The group of a thunk whose HLO (the instruction and everything it calls) is `instructions`; `vocab`: the token
    table's rows, which name the tied head's dots where the compiler dropped their metadata."""
    paths = [i.op_name for i in instructions]
    opcodes = {i.opcode for i in instructions}
    dots = [i for i in instructions if i.opcode in ("dot", "convolution")]
    if dots:
        # A dot inside a fusion may carry no metadata of its own: then the fusion's names tell, or its shape.
        names = [d.op_name for d in dots if d.op_name] or paths
        if any("tokens_embed.attend" in p or "GPT1._head" in p for p in names):
            return "matmul_lm_head"
        # Under data parallelism the head runs per batch group (GPT1.group_table) and XLA:CPU partitions its dots
        # without their op_name: the logits [.., V] and the table's gradient [V, D] are known by the vocabulary (the
        # hidden state's gradient, [.., D], is then counted as a projection).
        if not any(d.op_name for d in dots) and vocab in {n for d in dots for n in d.dims}:
            return "matmul_lm_head"
        if any(e in p for p in names for e in _ATTENTION_PRODUCTS) or any(d.batched for d in dots):
            return "matmul_attention"
        return "matmul_projection"
    if opcodes & _RNG_OPS and any("dropout" in p.lower() or "threefry" in p for p in paths):
        return "dropout_bits"
    if opcodes & {"exp", "reduce"} and any("/attn" in p for p in paths) and not any("attend" in p for p in paths):
        return "attention_softmax"
    if any(re.search(r"/ln_\d|/ln_f", p) for p in paths):
        return "layer_norm"
    if any("/mlp" in p for p in paths) and not any("Dropout" in p for p in paths):
        return "gelu"
    if any("take_along_axis" in p or "jvp()" in p or "logits" in p for p in paths):
        return "cross_entropy"
    if any("_take" in p or "embed" in p for p in paths):
        return "embedding"
    if any("/attn" in p for p in paths):
        return "attention_softmax"
    if any("dropout" in p.lower() for p in paths):
        return "dropout_bits"
    if opcodes <= _COPY_OPS | {"parameter", "constant"}:
        return "copy_transpose_convert"
    if any(p.startswith("jit(") and "jvp(" not in p for p in paths) or any(p.startswith("state.") for p in paths):
        return "optimizer"
    return "other"


def thunk_groups(hlo_text: str, vocab: int | None = None) -> dict[str, str]:
    """{top-level instruction name: group} for every instruction a thunk can be named after."""
    computations = parse_hlo(hlo_text)

    def body(instruction: Instruction, seen: set[str]) -> list[Instruction]:
        found = [instruction]
        for callee in instruction.calls:
            if callee in computations and callee not in seen:
                seen.add(callee)
                for inner in computations[callee]:
                    found += body(inner, seen)
        return found

    groups = {}
    for name, instructions in computations.items():
        for instruction in instructions:
            groups[instruction.name] = group_of(body(instruction, set()), vocab)
    return groups


@dataclasses.dataclass(frozen=True)
class Product:
    thunk: str  # the kind of thunk that runs it: its name without the number (ynn_fusion, dot, ...)
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    out: tuple[int, ...]
    flops: int


def products(hlo_text: str) -> dict[str, Product]:
    """{top-level instruction name: the matrix product it runs}, for each thunk that is a dot or calls one."""
    computations = parse_hlo(hlo_text)

    def product(thunk: str, computation: str, dot: Instruction) -> Product:
        shapes = {i.name: i.dims for i in computations[computation]}
        lhs, rhs, contracting = dot.dot
        k = math.prod(shapes[lhs][d] for d in contracting)
        return Product(thunk, shapes[lhs], shapes[rhs], dot.dims, 2 * math.prod(dot.dims) * k)

    fused = {callee for instructions in computations.values() for i in instructions if i.opcode == "fusion"
             for callee in i.calls}
    found = {}
    for computation, instructions in computations.items():
        if computation in fused:  # the inside of a fusion is not a thunk of its own
            continue
        for instruction in instructions:
            thunk = instruction.name.split(".")[0]
            if instruction.dot:
                found[instruction.name] = product(thunk, computation, instruction)
            for callee in instruction.calls:
                inner = [i for i in computations.get(callee, []) if i.dot]
                if inner:
                    found[instruction.name] = product(thunk, callee, inner[0])
    return found


def product_rows(thunks: list[dict], known: dict[str, Product], steps: int) -> list[dict]:
    """One row per kind of product (thunk kind and shapes), longest spans first: per step, how many, GFLOP, the
    seconds from each one's start to its end, the rate over those seconds, and the time-sliced seconds."""
    shares, _ = time_sliced(thunks)
    rows: dict[tuple, dict] = {}
    for thunk, share in zip(thunks, shares):
        p = known.get(thunk["op"])
        if p is None:
            continue
        row = rows.setdefault((p.thunk, p.lhs, p.rhs, p.out), {"n": 0, "flops": 0, "span": 0.0, "sliced": 0.0})
        row["n"] += 1
        row["flops"] += p.flops
        row["span"] += thunk["dur"] * 1e-6
        row["sliced"] += share
    return [{"product": thunk, "lhs": list(lhs), "rhs": list(rhs), "out": list(out),
             "per_step": round(r["n"] / steps, 1), "gflop": round(r["flops"] / steps / 1e9, 4),
             "span_s": round(r["span"] / steps, 5),
             "gflop_per_s_in_span": round(r["flops"] / max(r["span"], 1e-9) / 1e9),
             "seconds": round(r["sliced"] / steps, 4)}
            for (thunk, lhs, rhs, out), r in sorted(rows.items(), key=lambda kv: -kv[1]["span"])]


def read_trace(folder: Path, split: frozenset[str] = frozenset()) -> list[dict]:
    """The traced thunks of the newest perfetto trace under `folder`, each as {"op", "ts", "dur", "tid"}
    in microseconds. A thunk that runs asynchronously on the thread pool (a parallel loop fusion, an
    Eigen dot) returns from its own event at once and logs "end: NAME" when its work is done: its span
    runs to that event's end, unless the thunk is one XLA splits over its threads (`split`, from
    `split_thunks`) and the event is stale (`_stale_end`)."""
    files = sorted(folder.rglob("perfetto_trace.json.gz"), key=lambda f: f.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {folder}")
    events = json.load(gzip.open(files[-1]))
    events = events["traceEvents"] if isinstance(events, dict) else events
    started: dict[str, collections.deque] = collections.defaultdict(collections.deque)
    thunks, ends = [], []
    for e in sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"]):
        if "hlo_op" in e.get("args", {}):
            thunk = {"op": e["args"]["hlo_op"], "ts": e["ts"], "dur": e["dur"], "tid": e["tid"]}
            started[thunk["op"]].append(thunk)
            thunks.append(thunk)
        elif e["name"].startswith("end: ") and started[e["name"][5:]]:
            ends.append((started[e["name"][5:]].popleft(), e))
    busy = _ThreadBusy(thunks)
    for thunk, end in ends:
        if thunk["op"] not in split or not _stale_end(thunk, end, busy):
            thunk["dur"] = max(thunk["dur"], end["ts"] + end["dur"] - thunk["ts"])
    return thunks


def split_thunks(hlo_text: str) -> frozenset[str]:
    """The thunks of a compiled step that XLA:CPU splits over its threads (`outer_dimension_partitions`): the only
    ones whose "end:" event can be stale. An Eigen dot's work runs on the pool after a short launch event of its
    own, and its "end:" event is its end, whatever its thread ran just before it."""
    return frozenset(re.findall(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = [^\n]*outer_dimension_partitions", hlo_text, re.M))


class _ThreadBusy:
    """How long each thread spent inside thunks' own events over an interval (nested events counted once)."""

    def __init__(self, thunks: list[dict]):
        spans = collections.defaultdict(list)
        for t in thunks:
            spans[t["tid"]].append((t["ts"], t["ts"] + t["dur"]))
        self.merged: dict = {}
        for tid, intervals in spans.items():
            merged: list[list[float]] = []
            for start, end in sorted(intervals):
                if merged and start <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([start, end])
            starts = [m[0] for m in merged]
            before = [0.0]  # busy time of the merged intervals before each one
            for m in merged:
                before.append(before[-1] + m[1] - m[0])
            self.merged[tid] = (merged, starts, before)

    def within(self, tid, lo: float, hi: float) -> float:
        if tid not in self.merged or hi <= lo:
            return 0.0
        merged, starts, before = self.merged[tid]
        first = max(bisect.bisect_right(starts, lo) - 1, 0)
        last = bisect.bisect_left(starts, hi)  # intervals [first, last) may overlap [lo, hi)
        total = before[last] - before[first]
        total -= max(0.0, min(merged[first][1], lo) - merged[first][0])  # the parts outside [lo, hi)
        total -= max(0.0, merged[last - 1][1] - max(hi, merged[last - 1][0])) if last > first else 0.0
        return max(total, 0.0)


def _stale_end(thunk: dict, end: dict, busy: _ThreadBusy) -> bool:
    """Whether a thunk's "end:" event marks a queued share of its work that another thread found already done.
    A loop fusion split in two runs one half on its own thread and queues the other; when the pool thread is busy
    in a long product, the launching thread runs that half too, its users start at once, and the queued task logs
    "end:" only when the pool thread gets to it, up to ~180 ms later in the 117M bf16 step (2026-11-30,
    experiments/bench/README.md). A share that ran there ran right before its "end:" event, for about as long as the
    launching thread's: a thread that spent most of that time in other thunks' own events did not run it."""
    if end["tid"] == thunk["tid"]:
        return False
    hi = end["ts"] + end["dur"]
    lo = max(thunk["ts"], hi - thunk["dur"])
    room = (hi - lo) - busy.within(end["tid"], lo, hi)
    return room < 0.5 * (hi - lo)


def time_sliced(thunks: list[dict]) -> tuple[list[float], float]:
    """Each thunk's share of the wall clock: while k thunks run at once, each is charged 1/k of that time
    (so the shares add up to the time some thunk was running, the second value), in seconds."""
    points = sorted({t["ts"] for t in thunks} | {t["ts"] + t["dur"] for t in thunks})
    index = {p: i for i, p in enumerate(points)}
    starting: dict[int, list[int]] = collections.defaultdict(list)
    ending: dict[int, list[int]] = collections.defaultdict(list)
    for n, t in enumerate(thunks):
        starting[index[t["ts"]]].append(n)
        ending[index[t["ts"] + t["dur"]]].append(n)
    shares, running, busy = [0.0] * len(thunks), set(), 0.0
    for i, point in enumerate(points[:-1]):
        running.difference_update(ending[i])
        running.update(starting[i])
        if running:
            width = points[i + 1] - point
            busy += width
            for n in running:
                shares[n] += width / len(running)
    return [s * 1e-6 for s in shares], busy * 1e-6


def summarize(thunks: list[dict], groups: dict[str, str], steps: int, wall_s: float) -> dict:
    """Per group: wall-clock seconds per step (time-sliced among the thunks running together), share of
    the step, thunks per step; and the step's busy/idle split."""
    shares, busy = time_sliced(thunks)
    seconds, counts = collections.Counter(), collections.Counter()
    for thunk, share in zip(thunks, shares):
        group = groups.get(thunk["op"], "other")
        seconds[group] += share / steps
        counts[group] += 1 / steps
    busy /= steps
    return {
        "groups": {g: {"seconds": round(seconds[g], 4), "share": round(seconds[g] / wall_s, 3),
                       "thunks": round(counts[g], 1)} for g in GROUPS if counts[g]},
        "step_s": round(wall_s, 4), "busy_s": round(busy, 4), "idle_s": round(wall_s - busy, 4),
        "thunks_per_step": round(sum(counts.values()), 1),
    }


def traced_steps(compiled, trainer, batches: list, trace_dir: str | None, hlo: str):
    """(trace events, wall seconds per step, rusage before, after) of the steps after the first two (untimed),
    traced; `trace_dir` keeps the trace and the step's HLO."""
    state, steps = trainer.init(), len(batches) - 2
    for batch in batches[:2]:
        state, metrics = compiled(state, batch, trainer.hyper)
        float(metrics["loss"])
    jax.block_until_ready(state)  # nothing of the untimed steps may run into the trace
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(trace_dir or scratch)
        with jax.profiler.trace(str(folder), create_perfetto_trace=True):
            usage, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for batch in batches[2:]:
                state, metrics = compiled(state, batch, trainer.hyper)
                float(metrics["loss"])
            # The update's last thunks can end after the loss is ready: the clock stops when all have ended,
            # or the trace holds work the wall clock missed.
            jax.block_until_ready(state)
            wall = (time.perf_counter() - t0) / steps
            after = resource.getrusage(resource.RUSAGE_SELF)
        events = read_trace(folder, split_thunks(hlo))
        if trace_dir:
            (folder / "step.hlo").write_text(hlo)
    return events, wall, usage, after


def add_step_arguments(p) -> None:
    """The options that name the step to profile (this script's and experiments/bench/cpu_profile.py's)."""
    p.add_argument("--config", default="small", help="a preset name or YAML file (as `gpt1-jax bench --config`)")
    p.add_argument("--batch", type=int, default=None, help="global batch (default: the config's)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the config's)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    p.add_argument("--devices", type=int, default=1, help="split the CPU into N XLA devices, data-parallel")
    p.add_argument("--set", action="append", default=[], help="config override (e.g. model.scan_layers=true)")


def step_config(p, args) -> PretrainConfig:
    """The config of the step that `add_step_arguments`' options name; a bad option is `p.error`."""
    simulate_devices(args.devices if args.devices > 1 else None)  # before jax starts its backend
    overrides = [f"data.global_batch_size={args.batch}"] * (args.batch is not None)
    overrides += [f"data.seq_len={args.seq}"] * (args.seq is not None)
    overrides += [f"model.dtype={args.dtype}"] * (args.dtype is not None)
    try:
        config = resolve(PretrainConfig, args.config, overrides=[*overrides, *args.set],
                         mesh=f"data={args.devices}" if args.devices > 1 else None)
    except ConfigError as e:
        p.error(str(e))
    config = dataclasses.replace(config, model=flops.fit_compute_dtype(config.model))
    try:
        check_batch_size(make_mesh(config.mesh), config.data.global_batch_size, config.accum_steps)
    except ConfigError as e:
        p.error(str(e))
    return config


def compiled_step(p, args):
    """(config, trainer, compiled step) that `add_step_arguments`' options name; a bad one is `p.error`."""
    config = step_config(p, args)
    trainer = sizing.pretrain_trainer(config)
    return config, trainer, trainer.lower(lm_batch_spec(config.data.global_batch_size, config.data.seq_len)).compile()


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    add_step_arguments(p)
    p.add_argument("--steps", type=int, default=3, help="traced steps (after 2 untimed ones)")
    p.add_argument("--products", action="store_true",
                   help="also one line per kind of matrix product: its thunk, shapes, GFLOP, spans, rate in the step")
    p.add_argument("--trace-dir", help="keep the trace (and the step's HLO, step.hlo) here (default: a temporary folder)")
    args = p.parse_args(argv)
    if args.devices < 1 or args.steps < 1:
        p.error("--devices and --steps must be >= 1")
    if args.trace_dir:  # found now, not when the trace is written after compiling and running the steps
        try:
            Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
            probe = Path(args.trace_dir) / f".write-probe-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as e:
            p.error(f"--trace-dir {args.trace_dir}: {e.strerror or e}")
    if argv is None:  # a command line: profile the step as `gpt1-jax bench` and the training verbs run it
        hugepages.reexec_with_huge_pages()

    config, trainer, compiled = compiled_step(p, args)
    B, T = config.data.global_batch_size, config.data.seq_len
    hlo = compiled.as_text()
    groups = thunk_groups(hlo, config.model.vocab_size)

    events, wall, usage, after = traced_steps(compiled, trainer, seeded_batches(trainer, config, 2 + args.steps),
                                              args.trace_dir, hlo)
    result = summarize(events, groups, args.steps, wall)
    # XLA:CPU allocates the step's temporaries as one block per run, which glibc maps fresh (and the
    # kernel zero-fills page by page) on every step; experiments/bench/README.md measures what that costs.
    result.update(temp_bytes=compiled.memory_analysis().temp_size_in_bytes, **kernel_per_step(usage, after, args.steps),
                  malloc_huge_pages=hugepages.active())
    common = {"config": args.config, "batch": B, "seq": T, "dtype": config.model.dtype, "devices": args.devices}
    for name, row in result.pop("groups").items():
        print(json.dumps({**common, "group": name, **row}))
    if args.products:
        for row in product_rows(events, products(hlo), args.steps):
            print(json.dumps({**common, **row}))
    print(json.dumps({**common, "summary": True, **result, "tokens_per_s": round(B * T / wall, 1),
                      "cpu_flags": flops.cpu_flags()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
