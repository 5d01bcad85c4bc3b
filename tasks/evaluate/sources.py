"""Where an evaluation task's data comes from: a local dir, a URL (fetched with
the download stage's resumable, checksummed client and unpacked), an installed
package's catalogs, or a gettext source's holdout.  Each task ends up as one
local dir in the layout its reader expects."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

from xylent.tasks.download.http import fetch
from xylent.tasks.evaluate.data import drop_seen, holdout_messages, package_pairs, unique_pairs, write_probe, write_tatoeba
from xylent.errors import XylentError

EXCLUDED_FILE = "excluded_seen.json"  # gettext tasks with exclude_seen: pairs dropped per language


def _unpack(archive: Path, dest: Path, url: str) -> None:
    tmp = dest.with_name(dest.name + ".unpacking")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as t:
                t.extractall(tmp, filter="data")  # no absolute paths, links out of the dir or devices
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            raise XylentError("the task's URL is neither a zip nor a tar archive", where=url,
                              fix="point evaluate.tasks[].path at a .zip/.tar/.tar.gz of the task's files, "
                              "or at a local dir")
    except (zipfile.BadZipFile, tarfile.TarError, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise XylentError(f"cannot unpack the task archive: {exc}", where=url,
                          fix="check the file (its sha256 in the spec) or delete the cached copy and rerun") from None
    inner = [p for p in tmp.iterdir()]
    root = inner[0] if len(inner) == 1 and inner[0].is_dir() else tmp  # archives often wrap one folder
    shutil.rmtree(dest, ignore_errors=True)
    root.rename(dest)
    shutil.rmtree(tmp, ignore_errors=True)


def fetch_url(url: str, sha256: str | None, cache: Path, download_cfg) -> Path:
    """The unpacked dir of ``url``, cached by URL and checksum (an interrupted
    download resumes; a checksum mismatch discards the file and says so)."""
    key = hashlib.sha256(f"{url}\n{sha256}".encode()).hexdigest()[:16]
    dest = cache / key / "data"
    if (cache / key / "COMPLETE").is_file():
        return dest
    part = cache / key / "archive"
    fetch(url, part, sha256=sha256, retries=download_cfg.retries, backoff_s=download_cfg.backoff_s,
          timeout_s=download_cfg.timeout_s, chunk_bytes=download_cfg.chunk_bytes)
    _unpack(part, dest, url)
    (cache / key / "COMPLETE").write_text(url)
    return dest


def task_dirs(task, spec, upstream: dict[str, Path], data_root: Path, cache: Path) -> tuple[Path, Path | None]:
    """(the local dir holding ``task``'s data, the dir of its gold labels or None)."""
    data = task_dir(task, spec, upstream, data_root, cache)
    if task.labels:
        labels = spec.resolve_path(task.labels)
        if not labels.is_dir():
            raise XylentError(f"evaluate task {task.name!r}: labels dir {labels} does not exist",
                              where="spec field evaluate.tasks[].labels",
                              fix="point it at the folder with XTREME's gold test-<lang>.tsv files")
        return data, labels
    return data, (data / "labels" if (data / "labels").is_dir() else None)


def task_dir(task, spec, upstream: dict[str, Path], data_root: Path, cache: Path) -> Path:
    """The local dir holding ``task``'s data."""
    if task.format == "gettext":
        pairs = package_pairs(task.package, task.languages, max_pairs=None if task.exclude_seen else task.max_pairs)
        if task.exclude_seen:
            dropped = drop_seen(pairs, upstream["dedup"])
            pairs = {k: (xx[: task.max_pairs], en[: task.max_pairs]) for k, (xx, en) in pairs.items()}
            root = data_root / task.name
            root.mkdir(parents=True, exist_ok=True)
            (root / EXCLUDED_FILE).write_text(json.dumps(dropped, indent=2, sort_keys=True))
        for lang, (xx, _) in pairs.items():
            if not xx:
                raise XylentError(f"package {task.package!r} has no translated messages for {lang!r}",
                                  where=f"evaluate task {task.name!r}", fix="drop the language from the task")
        return write_tatoeba(data_root / task.name, pairs)
    if task.format == "holdout":
        source = next(s for s in spec.sources if s.name == task.source)
        langs = sorted({*task.languages, "en"})
        msgs = holdout_messages(upstream["download"], source.name, source.holdout.model_dump(), source.plurals, langs,
                                source.source_language)
        if task.kind in ("probe", "classification"):  # labelled sentences: a probe, or fine-tuned end to end
            english = {row[3]: row[2] for row in msgs["en"]} if task.plug_in else None
            return write_probe(data_root / task.name, {k: v for k, v in msgs.items() if k in task.languages},
                               task.train_language, english)
        english = {row[3]: row[2] for row in msgs["en"]}
        pairs = {lang: unique_pairs([(text, english[key]) for _, _, text, key in msgs[lang] if key in english],
                                    task.max_pairs) for lang in task.languages}
        return write_tatoeba(data_root / task.name, pairs)
    path = task.path
    if path.startswith(("http://", "https://", "s3://", "gs://", "az://", "abfs://")):
        return fetch_url(path, task.sha256, cache, spec.download)
    local = spec.resolve_path(path)
    if not local.is_dir():
        raise XylentError(f"evaluate task {task.name!r}: {local} is not a directory",
                          where="spec field evaluate.tasks[].path",
                          fix="point it at the folder with the task's files (or a URL of an archive of them)")
    return local
