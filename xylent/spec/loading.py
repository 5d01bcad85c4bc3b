"""Reading a spec: YAML (duplicate keys refused), ``extends:`` bases, ``--set`` overrides,
and validation errors that say what, where and what to do."""

from __future__ import annotations

import copy
import sys
import difflib
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from xylent.errors import XylentError
from xylent.spec.base import renamed_keys
from xylent.spec.root import Spec

# -- loading ------------------------------------------------------------------


def _renamed_paths() -> dict[str, str]:
    """{old dotted path: new} of the renamed fields of the spec's sections (their ``RENAMED``)."""
    out = {}
    for name, field in Spec.model_fields.items():
        for section in _models_in(field.annotation):
            out.update({f"{name}.{old}": f"{name}.{new}" for new, old in getattr(section, "RENAMED", {}).items()})
    return out


def current_path(path: str) -> str:
    """``pretrain.tasks`` -> ``pretrain.batch_kinds``: a --set written with a field's old name sets the field
    (a spec file that uses the new name would otherwise hold both)."""
    for old, new in _renamed_paths().items():
        if path == old or path.startswith(old + "."):
            return new + path[len(old):]
    return path


def apply_override(data: dict, assignment: str) -> None:
    """Apply one ``dotted.path=value`` override to a raw spec dict, in place."""
    if "=" not in assignment:
        raise XylentError(
            f"bad --set {assignment!r}", fix="write overrides as key.path=value, e.g. --set prepare.min_chars=5"
        )
    path, raw = assignment.split("=", 1)
    if not path.strip() or "" in path.strip().split("."):
        raise XylentError(f"bad --set {assignment!r}: no field named before '='",
                          fix="write overrides as key.path=value, e.g. --set prepare.min_chars=5")
    if current_path(path.strip()) != path.strip():
        print(f"xylent: --set {path.strip()} is now {current_path(path.strip())} (the old name still works; "
              "write the new one)", file=sys.stderr)
        path = current_path(path.strip())
    for old, new in _renamed_paths().items():  # a file written with the old name: the field moves to the new one
        section, old_key = old.split(".", 1)
        if isinstance(data.get(section), dict) and old_key in data[section] and (path + ".").startswith(new + "."):
            data[section][new.split(".", 1)[1]] = data[section].pop(old_key)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise XylentError(f"bad value in --set {assignment!r}: {exc}", fix="quote it or write valid YAML") from None
    keys = path.strip().split(".")
    node: Any = data
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        where = ".".join(keys[: i + 1])
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise XylentError(
                    f"--set {path}: {where!r} is not an index of a list of {len(node)} items",
                    fix="use a 0-based index that exists, e.g. sources.0.max_lines=1000",
                )
            idx = int(key)
            if last:
                node[idx] = value
            else:
                node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, {})
        else:
            raise XylentError(f"--set {path}: {'.'.join(keys[:i])!r} is a value, not a section")


def _models_in(annotation) -> list[type[BaseModel]]:
    """The spec sections an annotation can hold (through list[...], Optional and unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _walk(loc: tuple) -> tuple[tuple, list[type[BaseModel]]]:
    """An error location without its union tags (a source's ``kind`` sits in the location:
    ``sources.0.url.sha256``), and the spec sections the value at that location can be."""
    models: list[type[BaseModel]] = [Spec]
    path: list = []
    for part in loc:
        if isinstance(part, int):
            path.append(part)
            continue
        # "url" is both a tag and a field: a tag only where the section is still a union
        tagged = [m for m in models if "kind" in m.model_fields
                  and part in typing.get_args(m.model_fields["kind"].annotation)] if len(models) > 1 else []
        if tagged:
            models = tagged
            continue
        path.append(part)
        owner = next((m for m in models if part in m.model_fields), None)
        models = _models_in(owner.model_fields[part].annotation) if owner is not None else []
    return tuple(path), models


def _unknown_field(loc: tuple) -> str:
    fields = [f for m in _walk(loc[:-1])[1] for f in m.model_fields if f != "base_dir"]
    near = difflib.get_close_matches(str(loc[-1]), fields, n=1)
    hint = f"did you mean {near[0]!r}?" if near else "check the spelling;"
    return f"unknown field ({hint} every field of each section is in docs/spec.md)"


def _given_by(assignment: str, field: str) -> bool:
    """Whether the value at ``field`` came from this ``--set``: it set that field or a section
    around it.  A --set inside a section is not blamed for the section's own error."""
    path = assignment.split("=", 1)[0].strip()
    return field == path or field.startswith(path + ".")


def _format_validation_error(exc: ValidationError, source: str, overrides: tuple[str, ...] = ()) -> XylentError:
    lines, from_set = [], []
    for err in exc.errors():
        parts = tuple(p for p in err["loc"] if not str(p).startswith("function-"))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = _unknown_field(parts)
        loc = ".".join(map(str, _walk(parts)[0]))
        given = [ov for ov in overrides if loc and _given_by(ov, loc)]
        from_set += given
        lines.append(f"  - {loc or '(top level)'}: {msg}" + (f" (from --set {given[-1]})" if given else ""))
    where = source + "".join(f", --set {ov}" for ov in dict.fromkeys(from_set))
    return XylentError(
        "the spec is invalid:\n" + "\n".join(lines),
        where=where,
        fix="fix these fields in the YAML or in --set; every field is documented in docs/spec.md",
    )


def spec_from_dict(data: dict, *, source: str = "<spec>", base_dir: str = ".",
                   overrides: tuple[str, ...] = ()) -> Spec:
    data = dict(data)
    data["base_dir"] = base_dir
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise _format_validation_error(exc, source, tuple(overrides)) from None
    for line in renamed_keys(spec):  # read under the new name; said once per load, where the user looks
        print(f"xylent: {source}: {line} (the old name still works; write the new one)", file=sys.stderr)
    return spec


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an
    error: PyYAML would keep the last one silently, and half a spec would be ignored."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice in one mapping (only one would be used)",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


MAX_VALUES = 100_000  # the largest shipped spec has ~350; an alias bomb has billions


def _too_big(data: Any) -> bool:
    """Whether the YAML, its aliases (``&a`` / ``*a``) expanded, holds more than MAX_VALUES values.
    The loader shares an alias's object, so the file is small; merging it under ``extends:``
    or validating it walks every copy (gigabytes at depth 8)."""
    seen, stack = 0, [data]
    while stack:
        node = stack.pop()
        seen += 1 + (len(node) if isinstance(node, dict) else 0)  # the value, and a mapping's keys
        if seen > MAX_VALUES:
            return True
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _not_a_file(p: Path) -> str:
    """Why ``p`` is no spec file, in the words a user checks: a folder and a device are there, not missing."""
    return "is a folder, not a spec file" if p.is_dir() else (
        "is not a regular file (a device or a pipe?)" if p.exists() else "does not exist")


def _read_yaml(p: Path) -> dict:
    if not p.is_file():
        raise XylentError(f"spec file {p} {_not_a_file(p)}", fix="pass --spec with a YAML file, e.g. data_specs/demo.yaml")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as exc:
        raise XylentError(f"the spec is not UTF-8 text ({exc.reason} at byte {exc.start})", where=str(p),
                          fix="save the spec as UTF-8") from None
    except yaml.YAMLError as exc:
        raise XylentError(f"the spec is not valid YAML: {exc}", where=str(p)) from None
    if not isinstance(data, dict):
        raise XylentError("the spec must be a YAML mapping", where=str(p))
    if _too_big(data):
        raise XylentError(f"the spec holds more than {MAX_VALUES:,} values once its YAML aliases (*name) are "
                          "expanded (an alias bomb?)", where=str(p),
                          fix="write the values out or use fewer nested aliases; a spec holds a few hundred values")
    return data


def _merged(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``: mappings merge key by key, anything else (lists too) is replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _with_bases(p: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The spec at ``p`` with its ``extends:`` chain applied (a recipe = a base spec + what it changes)."""
    p = p.resolve()
    if p in seen:
        chain = " -> ".join(str(s) for s in (*seen, p))
        raise XylentError(f"specs extend each other in a cycle: {chain}", where=str(p), fix="remove one 'extends:'")
    data = _read_yaml(p)
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise XylentError("'extends' must be the path of one spec file", where=str(p),
                          fix="write e.g. extends: ../demo.yaml (relative to this file)")
    parent = p.parent / base
    if not parent.is_file():
        raise XylentError(f"the spec extends {parent}, which {_not_a_file(parent)}", where=f"{p}: extends: {base}",
                          fix="point 'extends:' at an existing spec file (relative to this file's folder)")
    return _merged(_with_bases(parent, (*seen, p)), data)


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Spec:
    """The spec file (with its ``extends:`` chain), then each ``--set`` override.  Relative
    paths, the base's included, are resolved against the folder of the file named here."""
    p = Path(path)
    data = copy.deepcopy(_with_bases(p) if p.is_file() else _read_yaml(p))
    for ov in overrides:
        apply_override(data, ov)
    return spec_from_dict(data, source=str(p), base_dir=str(p.resolve().parent), overrides=tuple(overrides))
