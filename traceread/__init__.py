"""traceread: read multi-GPU PyTorch profiler traces and say where each step's time goes.

The folders are the stages, and imports run one way through them (``docs/architecture.md``;
``tests/test_architecture.py`` enforces it):

    read → engine → analysis → assemble → compare → render / export → commands → cli

``collect`` (wraps the training job) and ``simulate`` (jobs with exact truth) stand beside that
path. Nothing on the read/analyse side imports torch.
"""

__version__ = "0.1.0"

#: The Python API (docs/api.md), loaded on first use so ``import traceread`` stays light.
_API = ("analyze", "Report")

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> object:
    if name in _API:
        from traceread import api

        return getattr(api, name)
    raise AttributeError(f"module 'traceread' has no attribute {name!r}")
