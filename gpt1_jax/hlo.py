"""What a compiled step's HLO text says beyond XLA's totals: how many times each computation runs per step (loops:
scanned layers, micro-batches) and how much the loops add to its FLOPs and bytes accessed.

XLA's cost analysis counts a loop body once, however many trips the loop makes: a step with scanned layers reports
about 1/L of its products and no more than one layer's memory traffic. `loop_factors` counts every body once per trip
with XLA's generic cost analysis, which runs on the compiled text of any target (a TPU program read on a CPU host),
and gives the ratio to its count of the same text with each body once; `sizing` applies it to the target's own
count. Measured against the same step compiled unrolled in docs/scale.md.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import jax
import jaxlib._hlo as xla_hlo  # jaxlib's HLO parser and cost analysis: no public jax API reaches them
from jax._src.lib import _jax

_HEADER = re.compile(r"^(?:ENTRY )?%?(?P<name>[\w.\-]+) ")
_CALLEE = re.compile(r"(?:calls|body|to_apply)=%([\w.\-]+)|(?:branch_computations|called_computations)=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_WHILE = re.compile(r" while\(.*condition=%([\w.\-]+), body=%([\w.\-]+)")
_LOOP_BOUND = re.compile(r"s32\[\][^=]*constant\((\d+)\)")
# The parser resolves a metadata's stack_frame_id against the module's frame table, which a computation taken out of
# its module lacks: it would log a warning per instruction.
_STACK_FRAME = re.compile(r" stack_frame_id=\d+")


def _callees(line: str) -> list[str]:
    """The computations an instruction calls: a fusion's, a reduction's adder, a loop's body (and, named separately,
    its condition), a conditional's branches."""
    loop = _WHILE.search(line)
    return [*(loop.groups() if loop else ()),
            *(c for single, many in _CALLEE.findall(line) for c in ([single] if single else re.findall(r"%([\w.\-]+)", many)))]


def runs_per_step(hlo_text: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(how many times each computation runs per step, [(computation, line)]). While loops (scan over
    layers, micro-batches) multiply their bodies and conditions by their trip count: XLA's `known_trip_count`
    where it says it, else the bound of the loop condition's `counter < N` (jax's scans count from 0)."""
    lines_of: list[tuple[str, str]] = []
    calls: dict[str, list[tuple[str, int | str]]] = defaultdict(list)
    order, entry, current = [], None, None
    for line in hlo_text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            m = _HEADER.match(line)
            current = m.group("name") if m else None
            if current:
                order.append(current)
                if line.startswith("ENTRY"):
                    entry = current
            continue
        if current is None or not line.startswith(" "):
            continue
        lines_of.append((current, line))
        loop = _WHILE.search(line)
        if loop:
            trip = _TRIP.search(line)
            for callee in loop.group(2), loop.group(1):  # the body, then the condition: as often (one test more)
                calls[current].append((callee, int(trip.group(1)) if trip else loop.group(1)))
            continue
        calls[current] += [(callee, 1) for callee in _callees(line)]
    bounds: dict[str, int] = {}
    for computation, line in lines_of:
        if "ROOT" in line and "direction=LT" in line:
            bounds[computation] = 0  # marks a `counter < N` condition; N is its s32 constant
    for computation, line in lines_of:
        bound = _LOOP_BOUND.search(line)
        if computation in bounds and bound:
            bounds[computation] = int(bound.group(1))
    runs: dict[str, int] = defaultdict(int)
    if entry is not None:
        runs[entry] = 1
    for name in reversed(order):  # callers are printed after their callees: ENTRY last
        for callee, factor in calls.get(name, ()):
            trips = factor if isinstance(factor, int) else max(bounds.get(factor, 1), 1)
            runs[callee] += runs[name] * trips
    return runs, lines_of


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str | None]:
    """({computation: its lines, header to closing brace}, the entry's name), in the text's order."""
    blocks: dict[str, list[str]] = {}
    entry, current = None, None
    for line in _STACK_FRAME.sub("", hlo_text).splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{") and not line.startswith("HloModule"):
            header = _HEADER.match(line)
            current = header.group("name") if header else None
            if current:
                blocks[current] = [line]
                entry = current if line.startswith("ENTRY") else entry
        elif current is not None:
            blocks[current].append(line)
            if line.startswith("}"):
                current = None
    return blocks, entry


def _reachable(blocks: dict[str, list[str]], root: str) -> set[str]:
    """`root` and every computation it calls, directly or not (fusions, reductions' adders, loops, branches)."""
    seen, todo = {root}, [root]
    while todo:
        for line in blocks[todo.pop()][1:]:
            for callee in _callees(line):
                if callee in blocks and callee not in seen:
                    seen.add(callee)
                    todo.append(callee)
    return seen


def _cpu_client() -> Any:
    try:
        return jax.devices("cpu")[0].client
    except RuntimeError:  # JAX_PLATFORMS without cpu
        return None


def loop_factors(hlo_text: str, client: Any = None) -> dict[str, float] | None:
    """{"flops": f, "bytes accessed": b}: how many times more the program computes and moves when each loop body
    counts once per trip than when it counts once, by XLA's cost analysis through `client`, the target's own (a
    GPU's knows its library calls, cuBLAS' products among them), or where it has none (a TPU compiled from this
    host) this host's CPU client, whose generic analysis reads any target's program; None for a program without
    loops or one neither can read.

    Each computation that runs as a loop body or condition is analysed as the entry of a module of its own: its own
    cost is that less the loops it runs itself (counted once inside it), and the step's cost is every such
    computation's own cost times its runs per step (`runs_per_step`)."""
    if " while(" not in hlo_text:
        return None
    blocks, entry = _computations(hlo_text)
    runs, _ = runs_per_step(hlo_text)
    loops = {name: [m.groups() for m in map(_WHILE.search, lines) if m] for name, lines in blocks.items()}

    def cost(root: str, client: Any) -> tuple[float, float]:  # of `root` run as the entry, every loop's body once
        needed = _reachable(blocks, root)  # a few computations: a step on a CPU has ~160 small loops (dropout's bits)
        text = [line for name, lines in blocks.items() if name in needed for line in lines + [""]]
        if root != entry:
            first = text.index(blocks[root][0])
            text[first] = "ENTRY " + text[first]
        analysed = _jax.hlo_module_cost_analysis(client, xla_hlo.hlo_module_from_text("HloModule m\n\n" + "\n".join(text)))
        return float(analysed.get("flops", 0.0)), float(analysed.get("bytes accessed", 0.0))

    roots = {entry, *(c for sites in loops.values() for s in sites for c in s)}
    for analyser in (client, _cpu_client()):
        try:
            inclusive = {name: cost(name, analyser) for name in roots}
            break
        except Exception:  # a compile-only client (TPU); text the generic parser does not take (a new instruction)
            continue
    else:
        return None
    total = [0.0, 0.0]
    for name, (flops, nbytes) in inclusive.items():
        for condition, body in loops[name]:  # counted once inside `name`; their own terms count them per trip
            flops -= inclusive[condition][0] + inclusive[body][0]
            nbytes -= inclusive[condition][1] + inclusive[body][1]
        total[0] += flops * runs[name]
        total[1] += nbytes * runs[name]
    once = inclusive[entry]
    return {"flops": total[0] / once[0] if once[0] else 1.0, "bytes accessed": total[1] / once[1] if once[1] else 1.0}
