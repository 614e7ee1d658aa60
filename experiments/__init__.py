"""Experiments run with gpt1_jax, each a module run from the repository root: `python -m experiments.paper.run ...`.

A script run by its path (`python experiments/paper/run.py`) has no package to import its parts from: each script
says so in one line before its imports (exit status 2).

Most modules here are parts the scripts import. `python -m` on one of those (a guess such as
`python -m experiments.paper.release`) ran nothing and exited 0, so it is refused here, where every such run passes
first (the package is imported before its module runs), in one line that names the scripts beside it."""

import sys
from pathlib import Path

_RUNS_AS_SCRIPT = 'if __name__ == "__main__"'


def _refuse_a_part_run_as_a_script() -> None:
    # While `python -m` finds its module, sys.argv[0] is "-m" (runpy sets the module's path once it runs).
    if sys.argv[:1] != ["-m"] or "-m" not in sys.orig_argv[:-1]:
        return
    module = sys.orig_argv[sys.orig_argv.index("-m") + 1]
    if not module.startswith(f"{__name__}."):
        return
    source = Path(__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
    if not source.is_file() or _RUNS_AS_SCRIPT in source.read_text():
        return  # a script, or a package or name Python itself answers for
    scripts = sorted(p.stem for p in source.parent.glob("[!_]*.py") if _RUNS_AS_SCRIPT in p.read_text())
    root = Path(__file__).parent.parent
    readme = next(r for r in (source.parent / "README.md", root / "README.md") if r.is_file()).relative_to(root)
    print(f"python -m {module}: not a script, a part the scripts import; the scripts beside it: "
          f"{', '.join(scripts) or 'none'} (see {readme.as_posix()})", file=sys.stderr)
    sys.exit(2)


_refuse_a_part_run_as_a_script()
