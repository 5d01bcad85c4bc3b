"""download stage: fetch every file a spec's sources name, once.

    run.py       what the flow calls: :func:`materialise` (one planned file into the workspace, cached by
                 its fingerprint), :func:`unit_fingerprint`, :func:`assemble` (the stage's output from its
                 units), and plan.py's :func:`plan_source`
    plan.py      :func:`plan_source` (what a source consists of), :class:`FetchItem`, :func:`opus_list_pairs`
    http.py      :func:`fetch` (one URL, resumable and verified)
    identity.py  :func:`source_identity`, :func:`spec_slice`: what a source's fingerprint sees
    content.py   the checks a fetched file's content must pass
    contract.py  the output contract: the records file and its reader

Names are re-exported on first use: importing one module of the package loads no other.
"""

from __future__ import annotations

from xylent.reexport import on_first_use

_HOME = {
    "VERSION": "tasks.download.run", "materialise": "tasks.download.run", "unit_fingerprint": "tasks.download.run",
    "FetchItem": "tasks.download.plan", "opus_list_pairs": "tasks.download.plan", "plan_source": "tasks.download.plan",
    "fetch": "tasks.download.http", "source_identity": "tasks.download.identity",
    "spec_slice": "tasks.download.identity",
}
__getattr__, __all__ = on_first_use(__name__, _HOME)
