"""Which spec fields count in the stages' fingerprints, pinned (issue 62, item 3).

A field added to a spec section changes every fingerprint that reads the section, and so turns
every workspace's outputs into cache misses, unless the section lists it in ``ADDED_LATER``
(left out while at its default) or ``OPERATIONAL`` (how to run, never counted): the rule is
:func:`xylent.stage.section_identity`.  Forgetting that is silent; this test makes it loud.
tests/data/fingerprinted_fields.json holds, per section class, the fields counted at their
defaults.  When it fails: list the new field in the section's ``ADDED_LATER`` (a knob whose
default changes nothing) or ``OPERATIONAL``; only if the new field does change outputs, bump
the stage's version in tasks/versions.py and rewrite the record:
``python -m tests.test_spec_fingerprinted --write``.
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path

from pydantic import BaseModel

from xylent.spec import Spec

RECORD = Path(__file__).parent / "data" / "fingerprinted_fields.json"


def _sections(model: type[BaseModel], seen: dict[str, type[BaseModel]]) -> dict[str, type[BaseModel]]:
    """Every section class reachable from ``model``'s fields (nested, in lists, optional)."""
    seen.setdefault(model.__name__, model)
    for field in model.model_fields.values():
        stack = [field.annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                if t.__name__ not in seen:
                    _sections(t, seen)
            else:
                stack += list(typing.get_args(t))
    return seen


def counted_fields() -> dict[str, list[str]]:
    out = {}
    for name, cls in sorted(_sections(Spec, {}).items()):
        left_out = set(getattr(cls, "OPERATIONAL", ())) | set(getattr(cls, "ADDED_LATER", ()))
        renamed = getattr(cls, "RENAMED", {})  # counted under the name the field was first fingerprinted with
        out[name] = sorted(renamed.get(f, f) for f in set(cls.model_fields) - left_out)
    return out


def test_no_field_joins_the_fingerprints_unnoticed():
    want = json.loads(RECORD.read_text())
    got = counted_fields()
    new = {s: sorted(set(f) - set(want.get(s, []))) for s, f in got.items()}
    new = {s: f for s, f in new.items() if f}
    assert not new, (f"spec fields counted in fingerprints that the record does not know: {new}. List each in its "
                     "section's ADDED_LATER (a knob whose default changes nothing) or OPERATIONAL; if it does change "
                     "outputs, bump the stage in tasks/versions.py and run "
                     "`python -m tests.test_spec_fingerprinted --write` (tests/test_spec_fingerprinted.py)")
    gone = {s: sorted(set(f) - set(got.get(s, []))) for s, f in want.items()}
    gone = {s: f for s, f in gone.items() if f}
    assert not gone, (f"fields the record counts that no longer count: {gone}: a renamed or dropped field changes "
                      "fingerprints too; rewrite the record once the stage's version says so")


def test_the_sections_list_only_fields_they_have():
    for name, cls in _sections(Spec, {}).items():
        for kind in ("OPERATIONAL", "ADDED_LATER"):
            extra = set(getattr(cls, kind, ())) - set(cls.model_fields)
            assert not extra, f"{name}.{kind} names {sorted(extra)}, which are not its fields"
        renamed = getattr(cls, "RENAMED", {})
        assert set(renamed) <= set(cls.model_fields) and not set(renamed.values()) & set(cls.model_fields), \
            f"{name}.RENAMED maps its fields' current names to old ones no field still has: {renamed}"


def test_field_descriptions_are_a_sentence_or_two_not_a_lab_notebook():
    """The spec's descriptions (what `xylent spec` and editors show) say what a knob does; why, how it was
    measured and what it costs live in docs/spec.md and the stage's page (issue 62, item 5)."""
    long = {f"{name}.{f}": len(fi.description) for name, cls in _sections(Spec, {}).items()
            for f, fi in cls.model_fields.items() if fi.description and len(fi.description) > 300}
    assert not long, f"descriptions over 300 characters: {long}; move the detail to docs/spec.md and link it"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    RECORD.write_text(json.dumps(counted_fields(), indent=1) + "\n")
    print(f"wrote {RECORD}")
