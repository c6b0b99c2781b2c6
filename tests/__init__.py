"""The test suite (a package, so that pytest puts the repository root on
``sys.path`` rather than ``tests/``, where ``tests/jax``, ``tests/torch`` and
``tests/devito`` would shadow the libraries of the same names)."""
