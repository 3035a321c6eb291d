from runs import hooks  # noqa: F401

raise ValueError("brokenapp's hooks cannot load")
