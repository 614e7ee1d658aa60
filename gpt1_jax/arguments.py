"""Every command line's argument parser (gpt1-jax's verbs, the experiment scripts, `python -m gpt1_jax.data` and
`python -m gpt1_jax.distributed`) and its numeric flag types: an error is one line, `PROG: error: ... (see PROG
--help)`, exit 2."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Callable


def at_least(low: int, *, at_most: int | None = None) -> Callable[[str], int]:
    """An integer flag's type that refuses values below `low` (or above `at_most`) in argparse's own error line."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if at_most is not None and value > at_most:
            raise argparse.ArgumentTypeError(f"must be <= {at_most}, got {value}")
        return value
    parse.__name__ = "int"  # argparse names the type in some errors
    return parse


def number_at_least(low: float, *, above: bool = False) -> Callable[[str], float]:
    """A float flag's type: finite and >= `low` (> `low` with `above`)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and (value > low if above else value >= low)):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if above else '>='} {low:g}, got {text}")
        return value
    parse.__name__ = "float"
    return parse


class _Unparsed(Exception):
    """An argparse error while Parser looks for unknown flags alone: the parse proper says it."""


class Parser(argparse.ArgumentParser):
    """argparse with a wrong flag as one line (`gpt1-jax VERB: error: ...`, exit 2), as every other error of the
    command line, not under a usage block of a dozen lines; the line says where the usage is. The experiment
    scripts parse with it too (experiments/harness.py `parser`)."""

    probing = False  # class-wide: each verb has a parser of its own

    def error(self, message: str):
        if Parser.probing:
            raise _Unparsed(message)
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        # argparse checks a verb's required flags before it returns the unknown ones: `gpt1-jax --bogus pretrain`
        # said "the following arguments are required: --workdir", not a word of --bogus
        known, extra = self._unknown_flags(args)
        if extra:  # argparse finds a verb's unknown flags in the top parser, which named no verb in the line
            prog = f"{self.prog} {known.verb}" if getattr(known, "verb", None) else self.prog
            self.exit(2, f"{prog}: error: unrecognized arguments: {' '.join(extra)} (see {prog} --help)\n")
        return super().parse_args(args, namespace)

    def _unknown_flags(self, args: list[str]) -> tuple[argparse.Namespace | None, list[str]]:
        """(what parses, the arguments no parser of the line knows), read with no flag or verb required; (None, [])
        where the line has another error, which the parse proper then names."""
        verbs = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
        parsers = [self, *(p for a in verbs for p in a.choices.values())]
        required = [x for p in parsers for x in [*p._actions, *p._mutually_exclusive_groups] if x.required]
        try:
            Parser.probing = True
            for x in required:
                x.required = False
            return self.parse_known_args(args)
        except _Unparsed:
            return None, []
        finally:
            Parser.probing = False
            for x in required:
                x.required = True
