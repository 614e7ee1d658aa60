"""gpt1-jax vs Hugging Face's OpenAIGPT (torch) at the shapes users run: one command, one JSON line per
measurement, then one summary line per target with the ratio jax / HF.

    python -m experiments.bench.compare_hf                       # every target below, 2 rounds
    python -m experiments.bench.compare_hf --targets train_small,generate_b1 --rounds 3
    python -m experiments.bench.compare_hf --targets train_117m --batch 64   # on a GPU: the paper's batch

Targets (same shapes; random tokens from one seed, drawn as each side batches them, so the training losses are
not compared; the same weights where outputs are, generation's ids):
  train_117m     GPT-1 117M, batch 2 x 512, forward + backward + optimizer, dropout on; fp32 and bf16
                 (jax: bf16 compute, fp32 params and Adam state; torch: autocast(cpu, bfloat16))
  train_small    the experiments' `small` preset (4 x 256, the paper release's shape), batch 16 x 128
  generate_b1    117M greedy generation, 128 new tokens after a 16-token prompt, batch 1: tokens/s and
                 whether both produced identical ids (jax loads the HF model's own random weights); HF's
                 OpenAIGPT has no KV cache, so its side is one timed call
  generate_b8    the same, 8 prompts
  finetune_sst2  `small` preset fine-tuning a classifier with the auxiliary LM loss (lambda 0.5), batch
                 32 x 64 (SST-2's bucketed length), vs HF's OpenAIGPTDoubleHeadsModel doing the same work;
                 examples/s, and jax's per-token cost relative to its own pre-training step at that shape;
                 fp32 and bf16 (torch: autocast, as train_117m)
  products_117m  the 117M train step's matrix products alone, at 2 x 512: each weight product forward and
                 its two gradients in the layouts a step runs them, the attention core's six, the tied LM head's
                 three, each timed alone through XLA and through torch; the tokens/s the step's products allow
                 at each library's rates (bf16: inputs bf16, XLA accumulating into fp32 as the model asks,
                 torch's bf16 product as autocast runs it). Says how much of train_117m's ratio is the products'

Each measurement runs in its own subprocess (no shared thread pools or memory), alternating jax / HF
for `--rounds` rounds so drift in the machine's speed hits both; summaries take medians. Where torch sees
a CUDA GPU, HF runs on it (autocast on cuda for bf16), as jax does on such a machine; `--batch` replaces
every target's batch, since the CPU shapes leave a GPU idle.
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("compare_hf.py: error: run it from the repository root as: "
          "python -m experiments.bench.compare_hf ...", file=sys.stderr)
    sys.exit(2)

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments import harness
from gpt1_jax import flops, heads, hugepages
from gpt1_jax.arguments import at_least
from gpt1_jax.config import MeshConfig, OptimConfig, PretrainConfig, resolve
from gpt1_jax.generate import generate
from gpt1_jax.step import lm_batch, lm_trainer, make_trainer
from gpt1_jax.weights import load_pretrained

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

ROOT = Path(__file__).resolve().parents[2]  # the workers run as `python -m experiments.bench.compare_hf` from here

TARGETS = {
    "train_117m": {"kind": "train", "config": "gpt1", "batch": 2, "seq": 512, "dtypes": ("float32", "bfloat16")},
    "train_small": {"kind": "train", "config": "small", "batch": 16, "seq": 128, "dtypes": ("float32", "bfloat16")},
    "generate_b1": {"kind": "generate", "config": "gpt1", "batch": 1, "seq": 16, "new": 128, "dtypes": ("float32",)},
    "generate_b8": {"kind": "generate", "config": "gpt1", "batch": 8, "seq": 16, "new": 128, "dtypes": ("float32",)},
    "finetune_sst2": {"kind": "finetune", "config": "small", "batch": 32, "seq": 64, "dtypes": ("float32", "bfloat16")},
    "products_117m": {"kind": "products", "config": "gpt1", "batch": 2, "seq": 512, "dtypes": ("float32", "bfloat16")},
}
LR = 1e-4


def model_config(name: str):
    return resolve(PretrainConfig, name).model  # as `gpt1-jax bench` resolves it


def hf_config(c, **extra):
    from transformers import OpenAIGPTConfig  # optional: see "HF workers" below

    return OpenAIGPTConfig(
        vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.d_model, n_layer=c.n_layers, n_head=c.n_heads,
        afn="gelu", resid_pdrop=c.resid_dropout, embd_pdrop=c.embd_dropout, attn_pdrop=c.attn_dropout,
        layer_norm_epsilon=c.layer_norm_eps, initializer_range=c.init_std, **extra,
    )


def torch_device():
    import torch  # optional: see "HF workers" below

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def tokens(seed: int, shape: tuple[int, ...], vocab: int):
    return np.random.default_rng(seed).integers(0, vocab, shape, dtype=np.int32)


def median_time(fn, n: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), [round(t, 4) for t in times]


def step_products(t: dict) -> list[tuple[str, int, int, int, int, str, int]]:
    """The train step's matrix products at `t`'s shape: (name, batch, m, k, n, layout, how many a step runs), the
    product being [m, k] @ [k, n] with its operands stored as the layout says: "nn" as written, "nt" the second
    stored [n, k] (a weight's transpose, the tied token table [V, D]), "tn" the first stored [k, m] (a gradient's
    X^T @ dY). Forward and both gradients of each; their FLOPs are flops.flops_per_token's but the embeddings'."""
    c = model_config(t["config"])
    rows, L, D, H = t["batch"] * t["seq"], c.n_layers, c.d_model, c.n_heads
    out = []
    for part, k, n in (("qkv", D, 3 * D), ("attn_out", D, D), ("mlp_fc", D, c.d_mlp), ("mlp_proj", c.d_mlp, D)):
        out += [(f"{part} fwd", 1, rows, k, n, "nn", L), (f"{part} dx", 1, rows, n, k, "nt", L),
                (f"{part} dw", 1, k, rows, n, "tn", L)]
    T, hd, bh = t["seq"], D // H, t["batch"] * H
    out += [("scores fwd", bh, T, hd, T, "nt", L), ("context fwd", bh, T, T, hd, "nn", L),
            ("scores dq", bh, T, T, hd, "nn", L), ("scores dk", bh, T, T, hd, "tn", L),
            ("context dp", bh, T, hd, T, "nt", L), ("context dv", bh, T, T, hd, "tn", L)]
    V = c.vocab_size
    return out + [("lm_head fwd", 1, rows, D, V, "nt", 1), ("lm_head dh", 1, rows, V, D, "nn", 1),
                  ("lm_head dtable", 1, V, rows, D, "tn", 1)]


def _operand_shapes(batch: int, m: int, k: int, n: int, layout: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    a, b = ((k, m) if layout == "tn" else (m, k)), ((n, k) if layout == "nt" else (k, n))
    return (batch, *a) if batch > 1 else a, (batch, *b) if batch > 1 else b


def products_rates(t: dict, args, product) -> dict:
    """Times each of the step's products alone (`product(a, b, layout)`: a call that runs it on the fp32 operands
    `a` and `b`, stored as `layout` says, once, and waits) -> their GFLOP/s and what the step's products take at
    those rates."""
    rates, seconds, flop, rng = {}, 0.0, 0, np.random.default_rng(args.seed)
    for name, batch, m, k, n, layout, count in step_products(t):
        a, b = (rng.standard_normal(shape, dtype=np.float32) for shape in _operand_shapes(batch, m, k, n, layout))
        run = product(a, b, layout)
        for _ in range(args.warmup + 1):  # at least one: jax compiles on the first call
            run()
        s, _ = median_time(run, args.steps)
        rates[name] = float(f"{2 * batch * m * k * n / s / 1e9:.4g}")  # GFLOP/s; a tiny test shape's too
        seconds, flop = seconds + count * s, flop + count * 2 * batch * m * k * n
    tokens_per_step = t["batch"] * t["seq"]
    return {"products_s": round(seconds, 4), "tokens_per_s": round(tokens_per_step / seconds, 2),
            "gflops": round(flop / seconds / 1e9, 1), "products": rates}


# ---- HF workers ------------------------------------------------------------------------------------
# torch and transformers are imported inside these functions: they are optional (the `dev` extra, which
# only this script and the parity tests need), and a jax worker or the driver runs without loading them.

def hf_train(t: dict, args) -> dict:
    """HF training steps (AdamW + clip 1.0, dropout on) on random tokens of `args.seed` (the shape of `gpt1-jax
    bench`'s, not its draws: bench draws one more token a row for the targets); finetune: the
    double-heads model with its multiple-choice head over one choice and the LM loss at lambda 0.5."""
    import torch  # optional: see above
    from transformers import OpenAIGPTDoubleHeadsModel, OpenAIGPTLMHeadModel

    c = model_config(t["config"])
    torch.manual_seed(args.seed)
    finetune = t["kind"] == "finetune"
    device = torch_device()
    model = (OpenAIGPTDoubleHeadsModel if finetune else OpenAIGPTLMHeadModel)(hf_config(c)).train().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    B, T, n = t["batch"], t["seq"], args.warmup + args.steps
    data = tokens(args.seed, (n, B, T), c.vocab_size).astype(np.int64)
    bf16 = args.dtype == "bfloat16"
    times, losses = [], []
    for i in range(n):
        ids = torch.from_numpy(data[i]).to(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            if finetune:
                out = model(input_ids=ids[:, None], mc_token_ids=torch.full((B, 1), T - 1, device=device),
                            labels=ids[:, None],
                            mc_labels=torch.zeros(B, dtype=torch.long, device=device))  # one choice: the head's work, label 0
                loss = out.mc_loss + 0.5 * out.loss
            else:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as gpt1_adam does
        opt.step()
        value = float(loss)  # on a GPU, waits for the step's kernels
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            losses.append(round(value, 6))
    step_s = statistics.median(times)
    return {"threads": torch.get_num_threads(), "device": str(device), "step_s_median": round(step_s, 4),
            "step_s": [round(x, 4) for x in times], "tokens_per_s": round(B * T / step_s, 2),
            "examples_per_s": round(B / step_s, 2), "losses": losses}


def hf_generate(t: dict, args) -> dict:
    """HF `generate`, greedy; saves its random model to `args.weights` (once) for the jax side to load."""
    import torch  # optional: see above
    from transformers import OpenAIGPTLMHeadModel

    c = model_config(t["config"])
    torch.manual_seed(args.seed)
    model = OpenAIGPTLMHeadModel(hf_config(c)).eval()
    if not (Path(args.weights) / "config.json").is_file():
        model.save_pretrained(args.weights)
    device = torch_device()
    model = model.to(device)
    prompt = torch.from_numpy(tokens(args.seed, (t["batch"], t["seq"]), c.vocab_size).astype("int64")).to(device)

    def run(new: int):
        with torch.inference_mode():
            return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                  min_new_tokens=new, do_sample=False, pad_token_id=0)

    run(2)  # warm up; then one timed call: OpenAIGPT has no KV cache, so a call takes minutes on 2 cores
    t0 = time.perf_counter()
    out = run(t["new"])
    s = time.perf_counter() - t0
    times = [round(s, 4)]
    return {"threads": torch.get_num_threads(), "device": str(device), "seconds_median": round(s, 4),
            "seconds": times, "tokens_per_s": round(t["batch"] * t["new"] / s, 2), "ids": out[:, t["seq"]:].cpu().tolist()}


def hf_products(t: dict, args) -> dict:
    import torch  # optional: see above

    device, dtype = torch_device(), torch.bfloat16 if args.dtype == "bfloat16" else torch.float32

    def product(a, b, layout):
        a, b = (torch.from_numpy(x).to(device, dtype) for x in (a, b))
        a, b = (a.transpose(-1, -2) if layout == "tn" else a), (b.transpose(-1, -2) if layout == "nt" else b)

        def run():
            torch.matmul(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize()
        return run

    with torch.inference_mode():
        return {"threads": torch.get_num_threads(), "device": str(device), **products_rates(t, args, product)}


# ---- jax workers -------------------------------------------------------------------------------------

def jax_train(t: dict, args) -> dict:
    cmd = [sys.executable, "-m", "gpt1_jax.cli", "bench", "--config", t["config"], "--batch-size", str(t["batch"]),
           "--seq-len", str(t["seq"]), "--steps", str(args.steps), "--warmup", str(args.warmup), "--lr", str(LR),
           "--schedule", "constant",  # HF's side trains at a constant lr
           "--seed", str(args.seed), "--dtype", args.dtype, *sum((["--set", s] for s in args.set), [])]
    return _run(cmd)


def jax_generate(t: dict, args) -> dict:
    config, params = load_pretrained(args.weights)[:2]
    prompt = tokens(args.seed, (t["batch"], t["seq"]), config.vocab_size)

    def run():
        return jax.block_until_ready(generate(config, params, prompt, max_new_tokens=t["new"], temperature=0.0))

    t0 = time.perf_counter()
    out = run()
    compile_s = time.perf_counter() - t0
    s, times = median_time(run, args.steps)
    return {"device_kind": jax.devices()[0].device_kind, "compile_s": round(compile_s - s, 2),
            "seconds_median": round(s, 4), "seconds": times, "tokens_per_s": round(t["batch"] * t["new"] / s, 2),
            "ids": np.asarray(out)[:, t["seq"]:].tolist()}


def jax_finetune(t: dict, args) -> dict:
    """The fine-tuning step `gpt1-jax finetune` runs (classifier head + lambda 0.5 LM loss, gpt1_adam), and
    the pre-training step on the same tokens, for the per-token cost ratio; bf16 as `finetune --set
    model.dtype=bfloat16` computes (fp32 where the CPU has no native bf16)."""
    c = flops.fit_compute_dtype(dataclasses.replace(model_config(t["config"]), dtype=args.dtype))
    B, T, n = t["batch"], t["seq"], args.warmup + args.steps
    optim = OptimConfig(lr=LR, schedule="constant", warmup_steps=0)
    data = tokens(args.seed, (n, B, T), c.vocab_size)
    labels = tokens(args.seed + 1, (n, B), 2)
    trainer = make_trainer(*heads.finetune_functions(c, "classification", 2, False, 0.1, 0.5, 1)[:2], optim, MeshConfig(),
                           seed=args.seed)
    batches = [trainer.put_batch({"tokens": data[i][:, None], "mask": np.ones((B, 1, T), np.float32),
                                  "clf_pos": np.full((B, 1), T - 1, np.int32), "labels": labels[i],
                                  "weights": np.ones((B,), np.float32)}) for i in range(n)]
    lm = lm_trainer(c, optim, MeshConfig(), seed=args.seed)
    lm_batches = [lm.put_batch(lm_batch(np.concatenate([data[i], data[i][:, :1]], axis=1))) for i in range(n)]

    def timed(trainer, batches):
        state, times, losses = trainer.init(), [], []
        for i, batch in enumerate(batches):
            t0 = time.perf_counter()
            state, metrics = trainer.step(state, batch)
            loss = float(metrics["loss"])
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
                losses.append(round(loss, 6))
        return statistics.median(times), times, losses

    step_s, times, losses = timed(trainer, batches)
    lm_step_s, _, _ = timed(lm, lm_batches)
    return {"device_kind": jax.devices()[0].device_kind, "step_s_median": round(step_s, 4),
            "step_s": [round(x, 4) for x in times], "losses": losses, "tokens_per_s": round(B * T / step_s, 2),
            "examples_per_s": round(B / step_s, 2), "pretrain_step_s_median": round(lm_step_s, 4),
            "per_token_cost_vs_pretrain": round(step_s / lm_step_s, 3), "malloc_huge_pages": hugepages.active()}


def jax_products(t: dict, args) -> dict:
    """A "tn" product runs as the compiled step runs it: its first operand transposed by a copy of its own, then an
    "nn" product (op_profile --products: lhs [768, 1024] for a [768, 2304] weight gradient). Given the stored
    operand, XLA:CPU fuses the transpose into a bf16 product 1.4-2.3x slower (2026-12-01, README.md)."""
    transpose = jax.jit(lambda x: jnp.swapaxes(x, -1, -2))

    def product(a, b, layout):
        batch = "b" if a.ndim == 3 else ""
        equation = f"{batch}mk,{batch}{'nk' if layout == 'nt' else 'kn'}->{batch}mn"
        a, b = jnp.asarray(a, args.dtype), jnp.asarray(b, args.dtype)
        f = jax.jit(lambda x, y: jnp.einsum(equation, x, y, preferred_element_type=jnp.float32))  # as the model asks
        if layout == "tn":
            return lambda: f(transpose(a), b).block_until_ready()
        return lambda: f(a, b).block_until_ready()

    return {"device_kind": jax.devices()[0].device_kind, **products_rates(t, args, product)}


WORKERS = {("hf", "train"): hf_train, ("hf", "finetune"): hf_train, ("hf", "generate"): hf_generate,
           ("jax", "train"): jax_train, ("jax", "finetune"): jax_finetune, ("jax", "generate"): jax_generate,
           ("hf", "products"): hf_products, ("jax", "products"): jax_products}


# ---- driver ----------------------------------------------------------------------------------------

def _run(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(name: str, t: dict, results: dict[str, dict[str, list[dict]]]) -> dict:
    summary: dict = {"summary": True, "target": name, "config": t["config"], "batch": t["batch"], "seq": t["seq"],
                     "cpu_flags": flops.cpu_flags()}
    runs = [r for by_impl in results.values() for rs in by_impl.values() for r in rs]
    summary["devices"] = sorted({str(r.get("device_kind") or r.get("device") or "cpu") for r in runs})
    for dtype, by_impl in results.items():
        med = {impl: statistics.median(r["tokens_per_s"] for r in rs) for impl, rs in by_impl.items()}
        row = {"jax_tokens_per_s": med["jax"], "hf_tokens_per_s": med["hf"], "ratio_jax_over_hf": round(med["jax"] / med["hf"], 3)}
        if t["kind"] == "train":
            row["jax_compile_s"] = statistics.median(r["compile_s"] for r in by_impl["jax"])
            row["jax_mfu"] = statistics.median(r["mfu"] for r in by_impl["jax"])
            if all("mfu_of_best_peak" in r for r in by_impl["jax"]):
                row["jax_mfu_of_best_peak"] = statistics.median(r["mfu_of_best_peak"] for r in by_impl["jax"])
        if t["kind"] == "finetune":
            row["jax_examples_per_s"] = statistics.median(r["examples_per_s"] for r in by_impl["jax"])
            row["hf_examples_per_s"] = statistics.median(r["examples_per_s"] for r in by_impl["hf"])
            row["jax_per_token_cost_vs_pretrain"] = statistics.median(r["per_token_cost_vs_pretrain"] for r in by_impl["jax"])
        if t["kind"] == "generate":
            row["ids_identical"] = all(a["ids"] == b["ids"] for a, b in zip(by_impl["jax"], by_impl["hf"]))
        if t["kind"] == "products":  # each product's GFLOP/s, the median of the rounds', XLA's beside torch's
            names = by_impl["jax"][0]["products"]
            row["products_gflops_jax_hf"] = {name: [statistics.median(r["products"][name] for r in by_impl[impl])
                                                    for impl in ("jax", "hf")] for name in names}
        summary[dtype] = row
    return summary


def with_batch(t: dict, batch: int | None) -> dict:
    return t if batch is None else {**t, "batch": batch}


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    p.add_argument("--rounds", type=at_least(1), default=2)
    p.add_argument("--steps", type=at_least(1), default=3, help="timed steps (generation: timed calls) per measurement")
    p.add_argument("--warmup", type=at_least(0), default=1)
    p.add_argument("--dtypes", default=None, help="restrict the targets' dtypes (e.g. float32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=None, help="every target's batch instead of its own (e.g. 64 on a GPU)")
    p.add_argument("--set", action="append", default=[], help="config override for the jax train step")
    p.add_argument("--worker", choices=("jax", "hf"), help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.batch is not None and args.batch < 1:
        p.error(f"--batch must be >= 1, got {args.batch}")
    if args.worker:
        t = with_batch(TARGETS[args.target], args.batch)
        if args.worker == "jax" and t["kind"] in ("finetune", "products"):
            # As `gpt1-jax finetune` runs (the train side's `gpt1-jax bench` does the same): without it the
            # finetune row measured ~30% below the verb on 2026-11-28's machine (experiments/bench/README.md).
            hugepages.reexec_with_huge_pages()
        result = WORKERS[(args.worker, t["kind"])](t, args)
        print(json.dumps({"impl": "gpt1_jax" if args.worker == "jax" else "hf_torch", "target": args.target,
                          "dtype": args.dtype, **result}), flush=True)
        return 0

    names = [n for n in args.targets.split(",") if n]
    if unknown := [n for n in names if n not in TARGETS]:
        p.error(f"unknown target(s) {unknown}; targets: {', '.join(TARGETS)}")
    if args.dtypes and not {d for d in args.dtypes.split(",") if d} & {d for n in names for d in TARGETS[n]["dtypes"]}:
        p.error(f"--dtypes {args.dtypes}: none of the targets runs it (they run "
                f"{', '.join(sorted({d for n in names for d in TARGETS[n]['dtypes']}))})")
    with tempfile.TemporaryDirectory(prefix="gpt1-jax-compare-") as tmp:
        for name in names:
            t = with_batch(TARGETS[name], args.batch)
            dtypes = [d for d in t["dtypes"] if not args.dtypes or d in args.dtypes.split(",")]
            results: dict[str, dict[str, list[dict]]] = {}
            weights = Path(tmp) / f"{t['config']}-seed{args.seed}"
            for _ in range(args.rounds):
                for dtype in dtypes:
                    for impl in ("hf", "jax"):  # HF first: generation's jax side loads the weights it saved
                        cmd = [sys.executable, "-m", "experiments.bench.compare_hf", "--worker", impl, "--target", name,
                               "--dtype", dtype, "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed),
                               "--weights", str(weights), *(["--batch", str(args.batch)] if args.batch else []),
                               *sum((["--set", s] for s in args.set), [])]
                        r = _run(cmd)
                        print(json.dumps({k: v for k, v in r.items() if k != "ids"}), flush=True)
                        results.setdefault(dtype, {}).setdefault(impl, []).append(r)
            print(json.dumps(summarize(name, t, results)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
