"""What every training rank program does the same way (pretrain's and the audit's
``xylent.models.training.trainer``, evaluate's fine-tuning ranks), whichever launch started it
(:mod:`xylent.launch`): it dies with the xylent process that started it, and it saves
and restores its random state with each checkpoint in one format."""

from __future__ import annotations

import os
import time
from pathlib import Path

from xylent.atomic import write_atomic


def save_rng(path: Path, cuda: bool) -> None:
    """This rank's random state (CPU, and its GPU's), written whole or not at all."""
    import torch

    state = {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if cuda else None}
    write_atomic(path, lambda tmp: torch.save(state, tmp))


def restore_rng(path: Path, cuda: bool) -> None:
    import torch

    state = torch.load(path, weights_only=True)  # tensors only: a tampered file cannot run code
    torch.set_rng_state(state["cpu"])
    if cuda and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"])


def watch_parent() -> None:
    """Die with the xylent process that started the launch (XYLENT_PARENT=pid:start, xylent/process_identity.py).

    A kill -9 of xylent gives its children no chance to stop the ranks (the
    launcher's own parent-death signal reaches only the launcher, which exits
    without stopping them), so every local rank checks ten times a second and takes its
    process group down when the parent is gone (the launcher's, ranks included, or, started
    directly, the rank's own)."""
    spec = os.environ.get("XYLENT_PARENT")
    if not spec:
        return
    import contextlib
    import signal
    import threading

    from xylent.process_identity import is_alive

    pid = spec.split(":")[0]

    def loop() -> None:
        while is_alive(spec):
            time.sleep(0.1)  # tiny CPU steps take ~0.1 s: a slower watch lets a kill -9'd run write on
        with contextlib.suppress(OSError):  # the log's reader was that process: the line may have nowhere to go
            print(f"xylent: the process that started this run ({pid}) is gone; stopping the ranks", flush=True)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=loop, name="xylent-parent-watch", daemon=True).start()
