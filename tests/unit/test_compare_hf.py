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
