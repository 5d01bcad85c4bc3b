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
import logging
import os
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
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError  # the public name; sync raises it too
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    name = "xylent-workspace-" + hashlib.sha256(str(root).encode()).hexdigest()[:16]
    with get_client(sync_client=True) as client:
        try:  # read first: creating one that exists makes the server log a traceback of its own
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # another run made it a moment ago
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
    slot = {"occupy": 1, "strict": True, "lease_duration": 60}
    with contextlib.ExitStack() as held:
        # the acquiring service logs the 423 of a held slot as an ERROR (after this thread saw it): a wait is none
        held.enter_context(_without(logging.getLogger("prefect._internal.concurrency"),
                                    "ConcurrencySlotAcquisitionWithLeaseService", "PrefectHTTPStatusError"))
        try:  # one try: the server answers 423 only while another run holds the slot (a slow server never does)
            held.enter_context(concurrency(name, max_retries=0, **slot))
        except ConcurrencySlotAcquisitionError as exc:
            cause = exc.__cause__
            if not (isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code == 423):
                raise
            log = get_run_logger()
            log.info("waiting for the workspace %s: another run holds it (concurrency slot %s)", root, name)
            started = time.monotonic()
            held.enter_context(concurrency(name, **slot))
            log.info("got the workspace %s after %.0f s", root, time.monotonic() - started)
        yield


@contextlib.contextmanager
def _without(logger: logging.Logger, *words: str):
    """``logger`` drops the records whose message has all of ``words``, meanwhile."""
    def keep(record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not all(w in text for w in words)

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)
