"""What xylent's deployments (prefect.yaml) need from Prefect: the pull step a
worker runs when a flow run starts, on the worker's machine, and the queue that
deployment runs on one workspace wait in.

``{{ $XYLENT_HOME }}`` in prefect.yaml would be filled in when deploying, baking
the deploying machine's path into every deployment; this step reads the
worker's own ``XYLENT_HOME`` (or the deployment's job variables) at run time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
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


@contextlib.contextmanager
def workspace_slot(root: str):
    """Deployment runs on one workspace queue for its Prefect concurrency slot
    (limit 1) instead of failing on the workspace lock; CLI runs (no deployment)
    keep the lock's immediate, clear refusal."""
    from prefect import get_run_logger
    from prefect.runtime import deployment

    if not deployment.id:
        yield
        return
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists

    name = "xylent-workspace-" + hashlib.sha256(str(root).encode()).hexdigest()[:16]
    with get_client(sync_client=True) as client:
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        # asked, not timed: on a loaded machine taking a free slot can outlast any short timeout
        busy = client.read_global_concurrency_limit_by_name(name).active_slots >= 1
    log = get_run_logger()
    notice = ("waiting for the workspace %s: another run holds it (concurrency slot %s)", root, name)
    got = threading.Event()

    def still_waiting():
        # two runs can ask in the same instant and both hear "free": the one that loses the race still says why it
        # waits, once the slot shows taken by someone else (a slow server alone is not "another run")
        with get_client(sync_client=True) as late_client:
            taken = late_client.read_global_concurrency_limit_by_name(name).active_slots >= 1
        if taken and not got.is_set():
            log.info(*notice)  # the adapter carries its run's id, so this works off the run's thread

    late = threading.Timer(5.0, still_waiting)
    with contextlib.ExitStack() as held:
        if busy:  # a free workspace is taken without a word
            log.info(*notice)
        else:
            late.start()
            held.callback(late.cancel)
        started = time.monotonic()
        held.enter_context(concurrency(name, occupy=1, strict=True, lease_duration=60))
        got.set()
        if busy or time.monotonic() - started > 5:
            log.info("got the workspace %s after %.0f s", root, time.monotonic() - started)
        yield
