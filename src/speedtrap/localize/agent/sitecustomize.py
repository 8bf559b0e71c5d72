"""Loaded by Python at start-up when this folder is on ``PYTHONPATH``: chain, then install the agent.

Another ``sitecustomize`` later on ``sys.path`` (a venv's, a distribution's) is executed first, as if
this one were not there; then speedtrap's agent arms its attach points. The agent does nothing
unless ``SPEEDTRAP_AGENT_DIR`` is set.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the other sitecustomize's own failure, reported as Python would
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)


_chain()
try:
    import speedtrap_agent

    speedtrap_agent.install()
except Exception as _exc:  # never break the process that starts
    print(f"speedtrap_agent: not installed: {type(_exc).__name__}: {_exc}", file=sys.stderr)
