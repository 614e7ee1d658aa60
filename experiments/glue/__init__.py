"""The paper's GLUE and RACE tables (Tables 2-5): one `gpt1-jax finetune` process per run."""
