"""The scale table: GPT-1 117M and GPT-1-shaped 350M / 1.3B / 6.7B / 13B models planned for TPU pods by the TPU
compiler on this CPU (`gpt1-jax plan --mesh auto`), plus the memory levers measured on one plan, and the probes:
three pods' meshes compiled one by one, which `--mesh auto`'s analytic HBM term is fitted to (hbm_fit.py).

    python -m experiments.scale.plan_table                    # every cell not yet recorded, then the table
    python -m experiments.scale.plan_table --only gpt1        # one model's cells
    python -m experiments.scale.plan_table --table            # rebuild results.json / README table / plot only

Each cell is one `gpt1-jax plan` process (so a 6.7B compile's memory is returned between cells), recorded
as records/<model>_b<batch>__<pod>.json (levers lever__*, probes probe__*) the moment it finishes: a rerun skips
finished cells.
Every model runs as a pod runs it: bf16 compute over fp32 parameters, layers scanned.
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("plan_table.py: error: run it from the repository root as: "
          "python -m experiments.scale.plan_table ...", file=sys.stderr)
    sys.exit(2)

import json
import subprocess
import tempfile
import time
from pathlib import Path


from experiments import harness
from gpt1_jax.files import atomic_write_text, pyplot, save_figure
from gpt1_jax.flops import cpu_flags

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RECORDS = RESULTS / "records"

# pod name -> (topology, slices); v4-32 and v5p-1024 count TensorCores (2 per chip), as Cloud names them.
PODS = {
    "v4-32": ("v4:2x2x4", 1),
    "v5e-256": ("v5e:16x16", 1),
    "v5p-1024": ("v5p:8x8x8", 1),
    "v6e-256": ("v6e:16x16", 1),
    "2x v5e-256": ("v5e:16x16", 2),
}
# (config, global batch in sequences of 512): the paper's batch, a pod batch, and the larger shapes at 256.
MODELS = [("gpt1", 64), ("gpt1", 512), ("gpt1-350m", 256), ("gpt1-1.3b", 256), ("gpt1-6.7b", 256), ("gpt1-13b", 256)]
RUN_AS = ["model.dtype=bfloat16", "model.scan_layers=true"]
# The memory levers, each on a fixed plan: (label, (config, batch, pod, mesh), extra overrides). Remat on 1.3B
# over all of a v5e-256 (activations dominate); optimizer state on 6.7B over a v4-32 (the state dominates).
_13B = ("gpt1-1.3b", 256, "v5e-256", "fsdp=256")
_67B = ("gpt1-6.7b", 256, "v4-32", "fsdp=16")
LEVERS = [
    ("fp32 optimizer state, remat none", _13B, []),
    ("bf16 optimizer state", _13B, ["optim.state_dtype=bfloat16"]),
    ("remat dots", _13B, ["model.remat=dots"]),
    ("remat full", _13B, ["model.remat=full"]),
    ("bf16 state + remat full", _13B, ["optim.state_dtype=bfloat16", "model.remat=full"]),
    ("remat full, fp32 optimizer state", _67B, ["model.remat=full"]),
    ("remat full, bf16 optimizer state", _67B, ["model.remat=full", "optim.state_dtype=bfloat16"]),
]


# Meshes compiled one by one, each pod's candidates without remat (and a few with it): what experiments/scale/
# hbm_fit.py fits `--mesh auto`'s analytic HBM term to, and checks its ranking against. (config, batch, pod, meshes)
PROBES = [
    ("gpt1", 64, "v5e-256", [f"data={d},fsdp={64 // d},tensor=4" for d in (1, 2, 4, 8, 16, 32, 64)]
     + ["data=8,fsdp=8,tensor=4 dots", "data=64,fsdp=1,tensor=4 full"]),
    ("gpt1-350m", 256, "v6e-256", [f"data={d},fsdp={f},tensor={t}" for d, f, t in (
        (1, 256, 1), (16, 16, 1), (256, 1, 1), (1, 128, 2), (8, 16, 2), (128, 1, 2), (1, 64, 4), (8, 8, 4),
        (64, 1, 4), (1, 32, 8), (32, 1, 8), (1, 16, 16))]),
    ("gpt1-1.3b", 256, "v5e-256", [f"data={d},fsdp={f},tensor={t}" for d, f, t in (
        (1, 256, 1), (16, 16, 1), (1, 64, 4), (8, 8, 4), (64, 1, 4), (1, 32, 8), (4, 8, 8), (1, 16, 16))]),
]


def probes() -> list[tuple[str, int, str, str, str, Path]]:
    """(config, batch, pod, mesh, remat, record path) of every probe."""
    out = []
    for config, batch, pod, meshes in PROBES:
        for item in meshes:
            mesh, _, remat = item.partition(" ")
            remat = remat or "none"
            out.append((config, batch, pod, mesh, remat, RECORDS / f"{_key('probe', config, f'b{batch}', pod, mesh, remat)}.json"))
    return out


def _lever_path(plan_spec, extra) -> Path:
    config, _, pod, _ = plan_spec
    return RECORDS / f"{_key('lever', config, pod, *extra) if extra else _key('lever', config, pod)}.json"


def _key(*parts) -> str:
    return "__".join(str(p).replace(" ", "_").replace("=", "").replace(",", "_") for p in parts)


def run_plan(config: str, batch: int, pod: str, mesh: str, extra: list[str]) -> dict:
    """One `gpt1-jax plan` process: its JSON, or {"fits": False, "error": its one line}."""
    topology, slices = PODS[pod]
    argv = [sys.executable, "-m", "gpt1_jax.cli", "plan", "--config", config, "--topology", topology,
            "--num-slices", str(slices), "--mesh", mesh, "--batch-size", str(batch), "--compile-top", "2",
            "--skip-baselines"] if mesh == "auto" else \
           [sys.executable, "-m", "gpt1_jax.cli", "plan", "--config", config, "--topology", topology,
            "--num-slices", str(slices), "--mesh", mesh, "--batch-size", str(batch)]
    for item in RUN_AS + extra:
        argv += ["--set", item]
    t0 = time.perf_counter()
    proc = _run_showing_status(argv)
    seconds = round(time.perf_counter() - t0, 1)
    if proc.returncode == 0:
        return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": seconds, "argv": argv[2:]}
    error = [line for line in proc.stderr.splitlines() if "error:" in line]
    if proc.returncode != 2 or not error:
        raise RuntimeError(f"{' '.join(argv[2:])} failed unexpectedly:\n{proc.stderr[-3000:]}")
    return {"fits": False, "error": error[-1], "wall_s": seconds, "argv": argv[2:], "cpu_flags": cpu_flags()}


# The child's lines shown as they come (what it compiles, the package's warnings); the rest of its stderr (its table,
# which the cell's line sums up, and libtpu's logging) is kept for the error of a cell that fails.
SHOWN = ("plan: ", "gpt1-jax: ")


def _run_showing_status(argv: list[str]) -> subprocess.CompletedProcess:
    """`argv` run with its stdout (its JSON line) and stderr captured, its SHOWN lines echoed to stderr under the
    cell's title as they come: a cell's compiles take minutes, which were silent."""
    with tempfile.TemporaryFile("w+") as out:  # a file, not a pipe: its stdout is never read while stderr is
        with subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, text=True) as proc:
            err = []
            for line in proc.stderr:
                err.append(line)
                if line.startswith(SHOWN):
                    print(f"    {line.rstrip()}", file=sys.stderr, flush=True)
        out.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, out.read(), "".join(err))


def record(path: Path, produce) -> dict:
    """A cell's record, made by `produce` unless it exists. Not experiments/harness.py's: a cell is a compile in
    its own process (the simulated device count is fixed when a process starts), with no workdir or outcome."""
    if path.is_file():
        return json.loads(path.read_text())
    result = produce()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result, indent=1) + "\n")
    return result


def run_all(only: str | None) -> None:
    cells = [(c, b, pod) for c, b in MODELS for pod in PODS if only in (None, c)]
    for i, (config, batch, pod) in enumerate(cells, 1):
        path = RECORDS / f"{_key(config, f'b{batch}', pod)}.json"
        _cell(f"[{i}/{len(cells)}] {config} batch {batch} on {pod}", path,
              lambda: run_plan(config, batch, pod, "auto", []))
    for label, (config, batch, pod, mesh), extra in LEVERS:
        if only not in (None, config):
            continue
        _cell(f"lever: {config} on {pod}, {label}", _lever_path((config, batch, pod, mesh), extra),
              lambda: run_plan(config, batch, pod, mesh, extra))
    for config, batch, pod, mesh, remat, path in probes():
        if only not in (None, config):
            continue
        _cell(f"probe: {config} batch {batch} on {pod}, {mesh} remat {remat}", path,
              lambda: run_plan(config, batch, pod, mesh, [f"model.remat={remat}"]))


def _cell(title: str, path: Path, produce) -> None:
    """A cell's title, the child's status lines under it (a cell not yet recorded), then its outcome."""
    print(title, flush=True)
    print(f"    -> {_cell_text(record(path, produce))}", flush=True)


def _cell_text(p: dict) -> str:
    if not p.get("fits"):
        return "does not fit" + (f" ({p['error'].split('error: ', 1)[-1][:120]})" if "error" in p else "")
    mesh = "x".join(str(p["mesh"][a]) for a in ("data", "fsdp", "tensor"))
    return (f"mesh {mesh} remat {p['remat']}: {p['peak_bytes_per_chip'] / 1e9:.1f}/{p['hbm_bytes_per_chip'] / 1e9:.1f} GB, "
            f"step >= {p['estimate']['step_s_lower_bound'] * 1e3:.1f} ms, MFU <= {p['estimate']['mfu_upper_bound']:.0%} "
            f"({p['estimate']['bound']}-bound)")


# ---- the table, results.json and the plot -------------------------------------------------------

def load() -> tuple[list[dict], list[dict]]:
    cells, levers = [], []
    for config, batch in MODELS:
        for pod in PODS:
            path = RECORDS / f"{_key(config, f'b{batch}', pod)}.json"
            if path.is_file():
                cells.append({"model": config, "batch": batch, "pod": pod, **json.loads(path.read_text())})
    for label, plan_spec, extra in LEVERS:
        path = _lever_path(plan_spec, extra)
        if path.is_file():
            levers.append({"lever": label, "model": plan_spec[0], "pod": plan_spec[2], "plan_mesh": plan_spec[3],
                           "overrides": extra, **json.loads(path.read_text())})
    return cells, levers


def summary_row(c: dict) -> dict:
    row = {"model": c["model"], "batch": c["batch"], "pod": c["pod"], "fits": bool(c.get("fits"))}
    if not row["fits"]:
        # "no mesh": the batch cannot split over the chips at all (a shape problem, not a memory one)
        no_mesh = "splits the batch" in (c.get("error") or "")
        return {**row, "status": "no mesh" if no_mesh else "does not fit", "error": c.get("error")}
    est = c["estimate"]
    return {**row, "params": c["num_params"], "chips": c["chips"], "chip": c["chip"], "mesh": c["mesh"],
            "remat": c["remat"], "peak_gb": c["peak_bytes_per_chip"] / 1e9, "hbm_gb": c["hbm_bytes_per_chip"] / 1e9,
            "state_gb": c["state_bytes_per_chip"] / 1e9, "step_ms": est["step_s_lower_bound"] * 1e3,
            "bound": est["bound"], "mfu": est["mfu_upper_bound"],
            "collectives": {k: {"count": v["count"], "gb": (v["ici_bytes_per_chip"] + v["dcn_bytes_per_chip"]) / 1e9}
                            for k, v in c["collectives"].items()},
            "compile_s": c["compile_s"], "auto_s": c.get("auto", {}).get("seconds"),
            "replicated_over_8mb": len(c.get("replicated_over_limit", []))}


def headline(rows: list[dict]) -> dict[str, dict]:
    """Per pod: the largest model that fits at batch >= 256, with its mesh."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["fits"] and r["batch"] >= 256 and r["params"] > best.get(r["pod"], {}).get("params", 0):
            best[r["pod"]] = r
    return best


def markdown(rows: list[dict], levers: list[dict]) -> str:
    lines = ["| model | batch | pod | mesh (data x fsdp x tensor) | remat | HBM per chip (peak / usable) | "
             "step lower bound | MFU upper bound | bound by | collectives per step (count, GB sent per chip) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"{r['model']} ({r['params'] / 1e6:,.0f}M)" if r["fits"] else r["model"]
        if not r["fits"]:
            lines.append(f"| {name} | {r['batch']} | {r['pod']} | **{r['status']}** | | | | | | "
                         f"{(r.get('error') or '').split('error: ', 1)[-1][:90]} |")
            continue
        mesh = " x ".join(str(r["mesh"][a]) for a in ("data", "fsdp", "tensor"))
        comms = ", ".join(f"{k} {v['count']}, {v['gb']:.2f}" for k, v in r["collectives"].items())
        lines.append(f"| {name} | {r['batch']} | {r['pod']} | {mesh} | {r['remat']} | {r['peak_gb']:.1f} / {r['hbm_gb']:.1f} GB "
                     f"| {r['step_ms']:.1f} ms | {r['mfu']:.0%} | {r['bound']} | {comms} |")
    if levers:
        lines += ["", "| plan (batch 256) | lever | state per chip | peak HBM per chip | step lower bound |",
                  "|---|---|---|---|---|"]
        for lv in levers:
            where = f"{lv['model']} on {lv['pod']}, {lv['plan_mesh']}"
            if lv.get("fits") is False and "peak_bytes_per_chip" not in lv:
                lines.append(f"| {where} | {lv['lever']} | | does not fit | |")
                continue
            step = lv.get("estimate", {}).get("step_s_lower_bound")
            lines.append(f"| {where} | {lv['lever']} | {lv['state_bytes_per_chip'] / 1e9:.3f} GB (optimizer "
                         f"{lv['opt_state_bytes_per_chip'] / 1e9:.3f}) | {lv['peak_bytes_per_chip'] / 1e9:.2f} GB | "
                         + (f"{step * 1e3:.1f} ms |" if step else "n/a |"))
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> None:
    plt = pyplot()

    pods = list(PODS)
    models = [f"{m} b{b}" for m, b in MODELS]
    fig, (ax_mem, ax_mfu) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(models)
    for j, (m, b) in enumerate(MODELS):
        mine = {r["pod"]: r for r in rows if r["model"] == m and r["batch"] == b}
        xs = [i + j * width for i in range(len(pods))]
        mem = [mine[p]["peak_gb"] / mine[p]["hbm_gb"] if p in mine and mine[p]["fits"] else 0 for p in pods]
        mfu = [mine[p]["mfu"] if p in mine and mine[p]["fits"] else 0 for p in pods]
        ax_mem.bar(xs, mem, width, label=models[j])
        ax_mfu.bar(xs, mfu, width, label=models[j])
        for x, p in zip(xs, pods):
            if p in mine and not mine[p]["fits"]:
                for ax in (ax_mem, ax_mfu):
                    ax.text(x, 0.02, "x", ha="center", color="red", fontsize=11, fontweight="bold")
    for ax, title in ((ax_mem, "peak HBM per chip / usable HBM (x: no plan)"),
                      (ax_mfu, "MFU upper bound of the roofline (x: no plan)")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(pods))], pods)
        ax.set_title(title, fontsize=10)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax_mem.legend(fontsize=8)
    fig.suptitle("GPT-1-shaped models planned by the TPU compiler (gpt1-jax plan --mesh auto)")
    fig.tight_layout()
    save_figure(fig, out, dpi=110)
    plt.close(fig)


def _into_readme(table: str) -> None:
    """The table between README.md's plan-table markers, so the README always shows the records."""
    readme = HERE / "README.md"
    text = readme.read_text()
    start, end = "<!-- plan-table -->", "<!-- /plan-table -->"
    if start not in text:
        return
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1] if end in rest else rest
    readme.write_text(f"{head}{start}\n{table}\n{end}{tail}")


def write_table() -> None:
    cells, levers = load()
    rows = [summary_row(c) for c in cells]
    results = {"rows": rows, "headline": headline(rows), "levers": [
        {k: lv.get(k) for k in ("lever", "model", "pod", "plan_mesh", "overrides", "fits", "state_bytes_per_chip",
                                "opt_state_bytes_per_chip",
                                "peak_bytes_per_chip", "mesh", "remat", "state_dtype")} for lv in levers],
        "command": "python -m experiments.scale.plan_table", "cells": len(rows)}
    (RESULTS / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    table = markdown(rows, levers)
    (RESULTS / "table.md").write_text(table + "\n")
    _into_readme(table)
    plot(rows, RESULTS / "scale.png")
    print(f"wrote {RESULTS / 'results.json'}, table.md and scale.png ({len(rows)} cells, {len(levers)} levers)")


def main() -> int:
    p = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    # choices: a misspelt config planned nothing and rewrote the table without a word
    p.add_argument("--only", default=None, choices=sorted({c for c, _ in MODELS}), help="one model config")
    p.add_argument("--table", action="store_true", help="only rebuild results.json, table.md and the plot")
    args = p.parse_args()
    if not args.table:
        run_all(args.only)
    write_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
