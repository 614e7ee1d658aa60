"""What tests/unit/test_cli.py and tests/e2e/test_cli.py share."""


def _one_error_line(capsys, verb: str) -> str:
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 1 and err[0].startswith(f"gpt1-jax {verb}: error: "), err
    return err[0]
