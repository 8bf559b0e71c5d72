"""speedtrap."""

__all__: list[str] = []  # the packages are its public parts, each with its own __all__
