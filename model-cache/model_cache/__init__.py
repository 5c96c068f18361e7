"""Weight preloader run as the init container of every vLLM pod (GitHub issue 5)."""

__version__ = "0.1.0"
