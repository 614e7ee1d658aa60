from gpt1_jax.data.bench import main

main()
