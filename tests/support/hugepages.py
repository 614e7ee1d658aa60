"""What tests/unit/test_hugepages.py and tests/e2e/test_hugepages.py share."""

import platform
import sys

LIBC, VERSION = platform.libc_ver()
# glibc reads the huge-page tunable from 2.35 on (gpt1_jax/hugepages.py leaves older ones alone)
NEW_GLIBC = sys.platform == "linux" and LIBC == "glibc" and tuple(map(int, VERSION.split(".")[:2])) >= (2, 35)
