"""Where the CPU time of one compiled train step goes: perf samples by library, and XLA's own loops kernel by kernel.

    python -m experiments.bench.cpu_profile --config gpt1 --batch 2 --seq 512 [--dtype bfloat16] [--seconds 10]

A worker process (this script with --worker) compiles the step, runs two untimed steps, says it is ready and
then trains on until it is stopped; `perf record -p` samples all its threads for --seconds. perf names the
samples in libjax_common (YNNPACK's and Eigen's products, XLA's runtime), libc and the kernel. XLA's generated
code (every fusion: LayerNorm, softmax, GELU, dropout, the update, copies) is anonymous to perf, but XLA registers
it with gdb's JIT interface, so `gdb -batch -p` names each sampled address after its HLO fusion. Prints one JSON
line per part (its share of the samples), one per XLA kernel name (the --kernels most sampled, shares of all
samples) and a summary: samples, the worker's median step over the window, the share of XLA's samples gdb named,
the CPU flags. op_profile.py says which thunks run when; this says what the cores spend their time on.
Needs `perf` (and `gdb` to name the kernels) with the right to trace a child process; a machine without says
so in one line. Measured with it: experiments/bench/README.md (2026-11-29).
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("cpu_profile.py: error: run it from the repository root as: "
          "python -m experiments.bench.cpu_profile ...", file=sys.stderr)
    sys.exit(2)

import collections
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from experiments import harness
from experiments.bench.op_profile import add_step_arguments, compiled_step, step_config
from gpt1_jax import flops, hugepages
from gpt1_jax.bench import seeded_batches

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

PARTS = (
    "ynnpack_products",     # YNNPACK's matrix-product kernels (ynn::dot_*)
    "ynnpack_other",        # its transposes, reductions and elementwise kernels
    "eigen_products",       # Eigen's products: the dots XLA:CPU does not give YNNPACK
    "xla_generated",        # XLA's JIT-compiled fusions
    "runtime",              # the rest of libjax_common: thunk executor, thread pools
    "kernel_zeroing_pages", # the kernel filling fresh pages with zeros
    "kernel_other",
    "libc",
    "other",
)
_SAMPLE = re.compile(r"^\s*([0-9a-f]+)\s+(.*)\s+\(([^()]*)\)\s*$")
_ZEROING = ("clear_page", "folio_zero", "clear_huge_page", "clear_subpage")
_GDB_NAME = re.compile(r"^(\S+) \+ \d+ in section")


def part_of(symbol: str, dso: str) -> str:
    """The part a perf sample belongs to, from its symbol and the object it ran in."""
    if dso.startswith("[kernel"):
        return "kernel_zeroing_pages" if symbol.startswith(_ZEROING) else "kernel_other"
    if "libjax_common" in dso:
        if symbol.startswith("ynn::dot"):
            return "ynnpack_products"
        if symbol.startswith("ynn::"):
            return "ynnpack_other"
        if symbol.startswith("Eigen::") and any(k in symbol for k in ("gemm", "gebp", "Contraction")):
            return "eigen_products"
        return "runtime"
    if "/perf-" in dso or dso == "[unknown]" or dso.startswith("[JIT]"):
        return "xla_generated"
    if "/libc.so" in dso:
        return "libc"
    return "other"


def read_samples(perf_script: str) -> list[tuple[int, str, str]]:
    """(address, symbol, object) of each sample in `perf script -F ip,sym,dso` output."""
    samples = []
    for line in perf_script.splitlines():
        m = _SAMPLE.match(line)
        if m:
            samples.append((int(m.group(1), 16), m.group(2).strip(), m.group(3)))
    return samples


def kernel_names(pid: int, addresses: list[int]) -> dict[int, str]:
    """{address: the JIT function gdb places it in} for a live process (empty where gdb is missing or fails)."""
    if not addresses or shutil.which("gdb") is None:
        return {}
    commands = ["set pagination off", *(f"info symbol {a:#x}" for a in addresses), "detach", "quit"]
    with tempfile.NamedTemporaryFile("w", suffix=".gdb") as script:
        script.write("\n".join(commands) + "\n")
        script.flush()
        try:
            done = subprocess.run(["gdb", "-q", "-batch", "-p", str(pid), "-x", script.name],
                                  capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return {}
    answers = [line for line in done.stdout.splitlines() if " in section " in line or line.startswith("No symbol")]
    if len(answers) != len(addresses):  # gdb could not attach, or said something unexpected: name nothing
        return {}
    return {a: m.group(1) for a, line in zip(addresses, answers) if (m := _GDB_NAME.match(line))}


def summarize(samples: list[tuple[int, str, str]], names: dict[int, str], kernels: int) -> tuple[dict, list, float]:
    """(share per part, [(kernel name, share)] most sampled first, share of XLA's samples named)."""
    parts, by_kernel = collections.Counter(), collections.Counter()
    xla = named = 0
    for address, symbol, dso in samples:
        part = part_of(symbol, dso)
        parts[part] += 1
        if part == "xla_generated":
            xla += 1
            if address in names:
                named += 1
                by_kernel[names[address]] += 1
    total = max(len(samples), 1)
    return ({p: parts[p] / total for p in PARTS if parts[p]},
            [(k, n / total) for k, n in by_kernel.most_common(kernels)], named / xla if xla else 0.0)


def worker(argv: list[str]) -> int:
    """Compiles the step, runs two untimed steps, prints "ready", then writes "START SECONDS" per step to the file
    after --log until killed (a file: a pipe nobody reads while perf samples would stop the steps)."""
    p = harness.parser("the step's worker: trains on until killed", prog=PROG)
    add_step_arguments(p)
    p.add_argument("--log", required=True)
    args = p.parse_args(argv)
    config, trainer, compiled = compiled_step(p, args)
    batches = seeded_batches(trainer, config, 2)
    state = trainer.init()
    for batch in batches:
        state, metrics = compiled(state, batch, trainer.hyper)
        float(metrics["loss"])
    print("ready", flush=True)
    with open(args.log, "w") as log:
        while True:
            t0 = time.time()
            state, metrics = compiled(state, batches[0], trainer.hyper)
            float(metrics["loss"])
            log.write(f"{t0!r} {time.time() - t0!r}\n")
            log.flush()


def _check_tools(p) -> None:
    if shutil.which("perf") is None:
        p.error("perf not found: install linux-tools (the `perf` command) to sample the CPU")
    done = subprocess.run(["perf", "record", "-q", "-o", os.devnull, "--", "true"], capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no reason given"])[-1]
        p.error(f"perf cannot sample here ({why}); see /proc/sys/kernel/perf_event_paranoid")


def _worker_argv(args) -> list[str]:
    """The step's options as `add_step_arguments` reads them back."""
    argv = ["--config", args.config, "--devices", str(args.devices)]
    for flag, value in (("--batch", args.batch), ("--seq", args.seq), ("--dtype", args.dtype)):
        argv += [flag, str(value)] if value is not None else []
    return argv + [a for s in args.set for a in ("--set", s)]


def main(argv: list[str] | None = None) -> int:
    command_line = argv is None
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1:])
    p = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    add_step_arguments(p)
    p.add_argument("--seconds", type=float, default=10.0, help="how long perf samples the running step")
    p.add_argument("--kernels", type=int, default=15, help="how many of XLA's kernels to list, most sampled first")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.kernels < 0:
        p.error("--seconds must be > 0 and --kernels >= 0")
    _check_tools(p)
    # A bad option is said here, once, not by the worker after its start-up; so is bf16 falling back to float32
    # on a CPU without native bf16: the worker is given the dtype that computes (and the summary names it).
    args.dtype = step_config(p, args).model.dtype
    if command_line:  # profile the step as `gpt1-jax bench` runs it (huge pages)
        hugepages.reexec_with_huge_pages()

    with tempfile.TemporaryDirectory() as scratch:
        log, data = Path(scratch) / "steps.log", Path(scratch) / "perf.data"
        child = subprocess.Popen([sys.executable, "-m", "experiments.bench.cpu_profile", "--worker",
                                  *_worker_argv(args), "--log", str(log)], stdout=subprocess.PIPE, text=True)
        try:
            for line in child.stdout:  # what the worker says before it is ready is for the user
                if line.strip() == "ready":
                    break
                print(line, end="", file=sys.stderr)
            else:
                child.wait(timeout=60)
                p.error(f"the step's worker ended before its steps (exit {child.returncode}): see the lines above")
            t0 = time.time()
            recorded = subprocess.run(["perf", "record", "-q", "-F", "999", "-p", str(child.pid), "-o", str(data),
                                       "--", "sleep", str(args.seconds)], capture_output=True, text=True)
            t1 = time.time()
            child.send_signal(signal.SIGSTOP)  # sampled: both cores to perf's and gdb's symbol reading (~8 s)
            script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym,dso"], capture_output=True,
                                    text=True)
            if recorded.returncode or script.returncode:
                why = ((recorded.stderr or script.stderr).strip().splitlines() or ["no reason given"])[-1]
                p.error(f"perf could not sample the step's worker: {why}")
            samples = read_samples(script.stdout)
            counts = collections.Counter(a for a, s, d in samples if part_of(s, d) == "xla_generated")
            names = kernel_names(child.pid, [a for a, _ in counts.most_common(5000)])  # while its code is loaded
        finally:
            child.send_signal(signal.SIGTERM)
            child.send_signal(signal.SIGCONT)  # a stopped process keeps a SIGTERM pending until it runs again
            child.communicate(timeout=60)
        steps = [float(s) for start, s in (line.split() for line in log.read_text().splitlines() if line.strip())
                 if t0 <= float(start) <= t1] if log.exists() else []
    parts, kernels, named = summarize(samples, names, args.kernels)
    for part, share in parts.items():
        print(json.dumps({"part": part, "share": round(share, 4)}))
    for kernel, share in kernels:
        print(json.dumps({"xla_kernel": kernel, "share": round(share, 4)}))
    print(json.dumps({"summary": True, "config": args.config, "dtype": args.dtype, "samples": len(samples),
                      "step_s_median": round(statistics.median(steps), 4) if steps else None,
                      "xla_samples_named": round(named, 3), "malloc_huge_pages": hugepages.active(),
                      "cpu_flags": flops.cpu_flags()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
