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
    "VERSION": "xylent.tasks.download.run", "materialise": "xylent.tasks.download.run", "unit_fingerprint": "xylent.tasks.download.run",
    "FetchItem": "xylent.tasks.download.plan", "opus_list_pairs": "xylent.tasks.download.plan", "plan_source": "xylent.tasks.download.plan",
    "fetch": "xylent.tasks.download.http", "source_identity": "xylent.tasks.download.identity",
    "spec_slice": "xylent.tasks.download.identity",
}
__getattr__, __all__ = on_first_use(__name__, _HOME)
