"""experiments/bench/compare_hf.py's summary line, built from its rounds' results (here made up: no model runs)."""

from experiments.bench import compare_hf


def _round(tokens_per_s: float, mfu: float, best: float | None = None) -> dict:
    return {"tokens_per_s": tokens_per_s, "compile_s": 1.0, "mfu": mfu, **({"mfu_of_best_peak": best} if best else {})}


def test_the_summary_gives_the_mfu_of_the_best_peak_where_every_round_has_it():
    target = {"config": "gpt1", "batch": 2, "seq": 512, "kind": "train"}
    hf = [{"tokens_per_s": 200.0}, {"tokens_per_s": 210.0}]
    rounds = [_round(460, 0.81, 0.70), _round(480, 0.74, 0.73)]
    kept = compare_hf.summarize("train_117m", target, {"float32": {"jax": rounds, "hf": hf}})
    assert kept["float32"]["jax_mfu"] == 0.775 and kept["float32"]["jax_mfu_of_best_peak"] == 0.715
    assert kept["float32"]["ratio_jax_over_hf"] == round(470 / 205, 3)
    rounds = [_round(460, 0.81), _round(480, 0.74, 0.73)]
    given = compare_hf.summarize("train_117m", target, {"float32": {"jax": rounds, "hf": hf}})
    assert "jax_mfu_of_best_peak" not in given["float32"]  # a round measured against a given peak has none


def test_the_step_products_are_the_steps_model_flops_but_the_embeddings():
    """products_117m times each matrix product of the train step alone: forward and both gradients of every weight
    product, the attention core's six, the tied LM head's three. Their FLOPs are flops.flops_per_token's, less the
    position table's and the biases' and norms' share of 6 x params (0.4% at 117M, 1.2% at `small`)."""
    from gpt1_jax import flops

    for name in ("gpt1", "small"):
        target = {**compare_hf.TARGETS["products_117m"], "config": name}
        products = compare_hf.step_products(target)
        counted = sum(2 * batch * m * k * n * count for _, batch, m, k, n, _, count in products)
        model = flops.flops_per_token(compare_hf.model_config(name), target["seq"]) * target["batch"] * target["seq"]
        assert 0.98 < counted / model < 1.0, (name, counted / model)
        assert {layout for *_, layout, _ in products} == {"nn", "nt", "tn"} and len(products) == 21


def test_the_products_summary_sets_each_products_rates_side_by_side():
    target = compare_hf.TARGETS["products_117m"]
    jax_rounds = [{"tokens_per_s": 900.0, "products": {"qkv fwd": 800.0}},
                  {"tokens_per_s": 1000.0, "products": {"qkv fwd": 900.0}}]
    hf_rounds = [{"tokens_per_s": 1100.0, "products": {"qkv fwd": 950.0}}] * 2
    row = compare_hf.summarize("products_117m", target, {"bfloat16": {"jax": jax_rounds, "hf": hf_rounds}})["bfloat16"]
    assert row["products_gflops_jax_hf"] == {"qkv fwd": [850.0, 950.0]}
    assert row["ratio_jax_over_hf"] == round(950 / 1100, 3)


def test_both_sides_run_every_product_of_a_tiny_step():
    """The workers themselves, at `tiny`'s 2 x 16: every product's operands fit its layout on both sides."""
    import argparse

    target = {**compare_hf.TARGETS["products_117m"], "config": "tiny", "seq": 16}
    args = argparse.Namespace(steps=1, warmup=0, seed=0, dtype="float32")
    sides = [compare_hf.jax_products(target, args), compare_hf.hf_products(target, args)]
    names = [name for name, *_ in compare_hf.step_products(target)]
    for side in sides:
        assert list(side["products"]) == names and all(rate > 0 for rate in side["products"].values())
        assert side["products_s"] > 0 and side["tokens_per_s"] > 0
