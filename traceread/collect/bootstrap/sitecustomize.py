"""traceread in-job bootstrap (put first on PYTHONPATH by ``traceread collect``).

Python imports ``sitecustomize`` at interpreter start. This file (1) runs any ``sitecustomize`` that
this one shadows, so the user's site setup still happens, and (2) hands over to
``_traceread_rank.install()``, which acts only inside a training rank. Nothing here may raise:
a failure must leave the user's process exactly as it would have been without traceread.
"""

import os as _os
import sys as _sys


def _traceread_chain() -> None:
    """Execute the ``sitecustomize`` that would have run without traceread on PYTHONPATH."""
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or not spec.origin:
        return
    if _os.path.dirname(_os.path.abspath(spec.origin)) == here:
        return
    module = importlib.util.module_from_spec(spec)
    _sys.modules["_traceread_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _traceread_chain()
except Exception as _exc:  # the chained file's own error: report it like Python would, go on
    try:
        _sys.stderr.write(f"Error in sitecustomize (chained by traceread): {_exc!r}\n")
    except Exception:
        pass

try:
    if _os.environ.get("TRACEREAD_RUN_DIR"):
        import _traceread_rank

        _traceread_rank.install()
except BaseException:  # never break the user's interpreter start
    pass
