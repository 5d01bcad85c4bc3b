"""Prefect pull steps for xylent's deployments (prefect.yaml), run by the worker
when a flow run starts, on the worker's machine.

``{{ $XYLENT_HOME }}`` in prefect.yaml would be filled in when deploying, baking
the deploying machine's path into every deployment; this step reads the
worker's own ``XYLENT_HOME`` (or the deployment's job variables) at run time.
"""

from __future__ import annotations

import os
from pathlib import Path


def enter_xylent_home() -> dict:
    """Change into the worker's checkout of xylent -> ``{"directory": ...}``."""
    home = os.environ.get("XYLENT_HOME")
    if not home:
        raise RuntimeError("XYLENT_HOME is not set on this worker: start the worker with XYLENT_HOME=<path of an "
                           "xylent checkout with its environment> (or set it in the deployment's job variables "
                           "env), or use the git_clone pull step shown in prefect.yaml")
    path = Path(home).expanduser().resolve()
    if not (path / "flows" / "pipeline.py").exists():
        raise RuntimeError(f"XYLENT_HOME={home} is not an xylent checkout (no flows/pipeline.py there)")
    os.chdir(path)
    return {"directory": str(path)}
