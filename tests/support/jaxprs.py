"""What tests/unit/test_model.py and tests/unit/test_dropout.py share: reading a traced program's equations."""


def all_eqns(jaxpr):
    """Every equation of `jaxpr` and of the jaxprs inside it (pjit, custom_vjp, checkpoint, ...)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from all_eqns(inner)
