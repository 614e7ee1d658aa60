"""gpt1-jax's train step vs Hugging Face's OpenAIGPTLMHeadModel (torch CPU, AdamW), same shapes, same data.

Each side runs in its own subprocess (no shared thread pools or memory), alternating jax / HF for a few
rounds so drift in the machine's speed hits both. Prints one JSON line per run, then a summary line with
the medians and the ratio jax / HF per dtype. bf16 means: jax bf16 compute with fp32 params and Adam
state; torch `autocast(cpu, bfloat16)` with fp32 params and AdamW state.

  python experiments/bench/compare_hf.py --config gpt1 --batch 2 --seq 512 --steps 3 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def hf_worker(args: argparse.Namespace) -> None:
    """Times HF training steps; the same fixed seeded tokens as `gpt1-jax bench`."""
    import numpy as np
    import torch
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    sys.path.insert(0, str(ROOT))
    from gpt1_jax.config import PretrainConfig, resolve

    c = resolve(PretrainConfig, args.config, overrides=args.set).model  # as `gpt1-jax bench` resolves it
    torch.manual_seed(args.seed)
    hf_config = OpenAIGPTConfig(
        vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.d_model, n_layer=c.n_layers, n_head=c.n_heads,
        afn="gelu", resid_pdrop=c.resid_dropout, embd_pdrop=c.embd_dropout, attn_pdrop=c.attn_dropout,
        layer_norm_epsilon=c.layer_norm_eps, initializer_range=c.init_std,
    )
    model = OpenAIGPTLMHeadModel(hf_config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    seq = args.seq or c.n_positions
    n = args.warmup + args.steps
    tokens = np.random.default_rng(args.seed).integers(0, c.vocab_size, (n, args.batch, seq), dtype=np.int32)
    bf16 = args.dtype == "bfloat16"
    times, losses = [], []
    for i in range(n):
        ids = torch.from_numpy(tokens[i].astype(np.int64))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as gpt1_adam does
        opt.step()
        value = float(loss)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            losses.append(round(value, 6))
    step_s = statistics.median(times)
    print(json.dumps({
        "impl": "hf_torch", "dtype": args.dtype, "batch": args.batch, "seq": seq, "threads": torch.get_num_threads(),
        "step_s_median": round(step_s, 4), "step_s": [round(t, 4) for t in times],
        "tokens_per_s": round(args.batch * seq / step_s, 2), "losses": losses,
    }), flush=True)


def _run(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="gpt1")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], help="config override, both sides (e.g. model.scan_layers=false)")
    p.add_argument("--jax-arg", action="append", default=[], help="extra argument for gpt1-jax bench")
    p.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.hf_worker:
        return hf_worker(args)

    common = ["--config", args.config, "--batch", str(args.batch), "--seq", str(args.seq), "--steps",
              str(args.steps), "--warmup", str(args.warmup), "--lr", str(args.lr), "--seed", str(args.seed)]
    for item in args.set:
        common += ["--set", item]
    results: dict[str, dict[str, list[dict]]] = {}
    for _ in range(args.rounds):
        for dtype in args.dtypes.split(","):
            jax_cmd = [sys.executable, "-m", "gpt1_jax.cli", "bench", *common, "--dtype", dtype, *args.jax_arg]
            hf_cmd = [sys.executable, __file__, "--hf-worker", *common, "--dtype", dtype]
            for impl, cmd in (("jax", jax_cmd), ("hf", hf_cmd)):
                r = _run(cmd)
                r["impl"] = "gpt1_jax" if impl == "jax" else r["impl"]
                print(json.dumps(r), flush=True)
                results.setdefault(dtype, {}).setdefault(impl, []).append(r)
    summary = {"summary": True, "config": args.config, "batch": args.batch, "seq": args.seq}
    for dtype, by_impl in results.items():
        jax_tps = statistics.median(r["tokens_per_s"] for r in by_impl["jax"])
        hf_tps = statistics.median(r["tokens_per_s"] for r in by_impl["hf"])
        summary[dtype] = {
            "jax_tokens_per_s": jax_tps, "hf_tokens_per_s": hf_tps, "ratio_jax_over_hf": round(jax_tps / hf_tps, 3),
            "jax_compile_s": statistics.median(r["compile_s"] for r in by_impl["jax"]),
            "jax_mfu": statistics.median(r["mfu"] for r in by_impl["jax"]),
        }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
