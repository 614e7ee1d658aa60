"""The HBM term of `--mesh auto`'s analytic ranking (gpt1_jax/plan.py `HBM_BYTES_PER`), fitted to compiled plans.

    python -m experiments.scale.hbm_fit     # fit, then each plan's error and each probed pod's ranking

Reads the scale table's records (its cells, the remat levers and the probes: records/probe__*.json, each pod's meshes
compiled one by one, `python -m experiments.scale.plan_table` makes them), fits the bytes a chip's step moves through
HBM as a non-negative sum of `plan.hbm_terms` (least squares on the ratio to the compiled count, so a 117M plan counts
as much as a 13B one), and prints one JSON object: the coefficients (what plan.py carries, to two digits), the
predicted-to-compiled ratio of every plan under plan.py's coefficients, and for each probed pod the meshes in compiled
order beside the analytic bound without and with the HBM term, and with the term fitted without that pod's probes.
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("hbm_fit.py: error: run it from the repository root as: "
          "python -m experiments.scale.hbm_fit ...", file=sys.stderr)
    sys.exit(2)

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from experiments import harness
from experiments.scale.plan_table import PODS, RECORDS, RUN_AS
from gpt1_jax import plan
from gpt1_jax.config import PretrainConfig, resolve

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

TERMS = list(plan.HBM_BYTES_PER)
# Levers that change what the terms do not model (a narrower optimizer state) are left out of the fit.
_UNMODELLED = ("optim.state_dtype", "model.attention", "dropout")


def _config(record: dict) -> PretrainConfig:
    argv = record["argv"]
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    mesh = record["mesh"]
    return resolve(PretrainConfig, argv[argv.index("--config") + 1],
                   overrides=[f"data.global_batch_size={record['global_batch']}", f"data.seq_len={record['seq_len']}",
                              *RUN_AS, *sets, f"model.remat={record['remat']}"],
                   mesh=f"data={mesh['data']},fsdp={mesh['fsdp']},tensor={mesh['tensor']}")


def load(records: Path = RECORDS) -> list[tuple[str, PretrainConfig, dict]]:
    """(record name, config, record) of every compiled plan whose HBM traffic was counted per trip."""
    out = []
    for path in sorted(records.glob("*.json")):
        r = json.loads(path.read_text())
        if not r.get("compiled") or r.get("loop_bodies_counted") == "once" or \
                any(a.startswith(_UNMODELLED) for a in r["argv"]):
            continue
        out.append((path.stem, _config(r), r))
    return out


def features(plans) -> np.ndarray:
    return np.array([[plan.hbm_terms(c, c.mesh, r["remat"])[k] for k in TERMS] for _, c, r in plans])


def fit(plans) -> dict[str, float]:
    """Coefficients minimising the squared relative error of the predicted bytes."""
    x, y = features(plans), np.array([r["xla_bytes_accessed_per_chip"] for _, _, r in plans])
    coef, _ = nnls(x / y[:, None], np.ones(len(y)))
    return dict(zip(TERMS, coef))


def _two_digits(v: float) -> float:
    return float(f"{v:.2g}")


def _probed_pod(name: str) -> str | None:
    """"gpt1__b64__v5e-256" for a probe's record name, else None."""
    return "__".join(name.split("__")[1:4]) if name.startswith("probe__") else None


def probed_pods(plans) -> dict[str, list[tuple[PretrainConfig, dict]]]:
    pods = defaultdict(list)
    for name, c, r in plans:
        if _probed_pod(name):
            pods[_probed_pod(name)].append((c, r))
    return dict(pods)


def rankings(plans, coefficients: dict[str, dict[str, dict[str, float]]]) -> dict[str, list[dict]]:
    """Per probed pod: its meshes by compiled step bound, each with the analytic bound (ms) under each labelled
    set of coefficients, given per pod (a fit without that pod's probes differs by pod)."""
    out = {}
    for pod_key, members in probed_pods(plans).items():
        where = plan.target(*PODS[pod_key.split("__")[2]])
        rows = []
        for c, r in sorted(members, key=lambda m: m[1]["estimate"]["step_s_lower_bound"]):
            row = {"mesh": "x".join(str(r["mesh"][a]) for a in ("data", "fsdp", "tensor")), "remat": r["remat"],
                   "compiled_ms": round(r["estimate"]["step_s_lower_bound"] * 1e3, 2)}
            for label, per_pod in coefficients.items():
                est = plan.analytic_estimate(c, c.mesh, r["remat"], where, r["state_bytes_per_chip"], per_pod[pod_key])
                row[f"analytic_ms ({label})"] = round(est["step_s_lower_bound"] * 1e3, 2)
            rows.append(row)
        out[pod_key] = rows
    return out


def main() -> None:
    # --help; a flag it has not (it has none)
    harness.parser(prog=PROG, description=__doc__.splitlines()[0]).parse_args()
    plans = load()
    ratios = features(plans) @ np.array([plan.HBM_BYTES_PER[k] for k in TERMS]) / \
        np.array([r["xla_bytes_accessed_per_chip"] for _, _, r in plans])
    pods = probed_pods(plans)
    every_pod = lambda coef: dict.fromkeys(pods, coef)  # noqa: E731
    held_out = {pod: fit([p for p in plans if _probed_pod(p[0]) != pod]) for pod in pods}
    print(json.dumps({
        "fitted": {k: _two_digits(v) for k, v in fit(plans).items()},
        "in_plan_py": dict(plan.HBM_BYTES_PER),
        "plans": len(plans),
        "ratio_range": [round(float(ratios.min()), 2), round(float(ratios.max()), 2)],
        "ratios": {n: round(float(q), 2) for (n, _, _), q in zip(plans, ratios)},
        "rankings": rankings(plans, {"no HBM term": every_pod(dict.fromkeys(TERMS, 0.0)),
                                     "plan.py": every_pod(plan.HBM_BYTES_PER),
                                     "fitted without this pod's probes": held_out}),
    }, indent=1))


if __name__ == "__main__":
    main()
