"""envhub's version, apart from the package's ``__init__`` so that modules the package imports
can read it without importing the package (``envhub.__version__`` is this)."""

__version__ = "0.1.0"
