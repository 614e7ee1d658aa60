import os
import sys

from gpt1_jax.data.bench import main
from gpt1_jax.errors import DEBUG_ENV, GPT1JaxError, os_error_message

try:
    main()
except (GPT1JaxError, OSError) as e:  # a source that does not open, a folder it cannot write: one line, as gpt1-jax's
    if os.environ.get(DEBUG_ENV):
        raise
    message = e if isinstance(e, GPT1JaxError) else os_error_message(e)
    print(f"python -m gpt1_jax.data: error: {message}", file=sys.stderr)
    sys.exit(2)
