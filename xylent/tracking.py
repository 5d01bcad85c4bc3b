"""MLflow tracking with explicit run ids.

MLflow's "active run" is thread-local, and Prefect runs tasks on worker threads
(or other processes), so nothing here relies on it: every call names its run.
One parent run per ``xylent run``; one nested run per stage (linked with the
``mlflow.parentRunId`` tag, which the MLflow UI shows as nesting).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping

from xylent.errors import XylentError
from xylent.redact import redact, redact_text


# the stores a run can log to and register its model in: a database (SQLAlchemy's schemes) or a server
STORE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc")


def tracking_source(configured: str | None = None) -> str | None:
    """Which setting names the store: the spec's field, the environment, or None (the workspace's own)."""
    if configured:
        return "spec field tracking.tracking_uri"
    return "$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else None


def tracking_uri_for(workspace_root: Path, configured: str | None = None) -> str:
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return _supported(uri, tracking_source(configured))
    if bad := next((c for c in "%?#" if c in str(workspace_root)), None):
        # SQLAlchemy reads the store's URI as a URL: "?" starts its query, "%41" decodes to "A" (and
        # MLflow makes the folders of the undecoded path): the store would land outside the workspace
        raise XylentError(f"the workspace path holds {bad!r}, which the URI of its MLflow store "
                          "(sqlite:///<workspace>/mlflow.db) would read as part of a URL: the store would "
                          "land outside the workspace", where=str(workspace_root),
                          fix="use a workspace path without %, ? or #, or point tracking.tracking_uri "
                              "(or MLFLOW_TRACKING_URI) at a store elsewhere")
    return f"sqlite:///{workspace_root}/mlflow.db"


def _supported(uri: str, where: str) -> str:
    """``uri`` if MLflow can keep a run's metrics and registered models there; a KeyError or a "file store"
    failure after the data stages otherwise."""
    scheme = scheme_of(uri) if "://" in uri or uri.startswith("databricks") else ""
    if scheme in STORE_SCHEMES:
        return uri
    what = ("a folder: MLflow's file store, which xylent does not run on (MLflow 3.7 moved its default to a database)"
            if scheme in ("", "file") else f"scheme {scheme!r}, which is no MLflow store xylent can use")
    raise XylentError(f"the MLflow tracking URI {redact_text(uri)!r} names {what}", where=where,
                      fix="use sqlite:///<folder>/mlflow.db, a database URL (postgresql://...), a tracking server "
                          "(http://host:5000), or leave it unset for the workspace's own store")


def import_store(uri: str) -> None:
    """Import the MLflow store a :class:`Tracker` on ``uri`` opens (MLflow and, for a database,
    its SQLAlchemy store: ~2 s together), so a caller can pay for it while it waits anyway."""
    import mlflow  # noqa: F401

    if uri.split(":", 1)[0].lower().split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql"):
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


def scheme_of(uri: str) -> str:
    """``http``, ``sqlite`` (``sqlite+pysqlite`` too), ``postgresql`` ...: which kind of store ``uri`` names."""
    return uri.split(":", 1)[0].lower().split("+", 1)[0]


def is_server(uri: str) -> bool:
    """A tracking server (its own artifact store, a UI of its own), not a local database or folder."""
    return uri.split(":", 1)[0].lower() in ("http", "https", "databricks", "databricks-uc")


def artifact_root_for(workspace_root: Path, uri: str) -> Path | None:
    """Where a new experiment keeps its artifacts: the workspace's ``mlartifacts/``
    for a local store; a server's own store (proxied ``mlflow-artifacts:`` or its
    default root) otherwise, so teammates can open them."""
    return None if is_server(uri) else workspace_root / "mlartifacts"


UI_URL_ENV = "XYLENT_MLFLOW_UI_URL"  # the MLflow UI's address as people open it


def ui_base(uri: str) -> str:
    """Where a person opens the runs of ``uri``: ``$XYLENT_MLFLOW_UI_URL`` when set (a server
    that containers reach by a name, http://mlflow:5000, no browser resolves; or ``mlflow ui``
    on another port), else the tracking server itself, else ``mlflow ui``'s default address."""
    public = os.environ.get(UI_URL_ENV, "").strip()
    if public:
        return public.rstrip("/")
    return uri.rstrip("/") if is_server(uri) else "http://127.0.0.1:5000"


# MLflow 3's UI (3.17) shows an experiment in its GenAI mode (an overview of traces; runs listed under
# "Evaluations") unless the address asks for its machine-learning mode: the experiment's kind tag alone
# does not decide it.  Every link xylent writes asks for the runs view.
ML_VIEW = "?workflowType=machine_learning"


def how_to_view(uri: str, page: str | None = None) -> str:
    """The command or address that shows a store's runs (``page``: the one to open there)."""
    if is_server(uri):
        return f"open {page or ui_base(uri)}"
    return f"run `mlflow ui --backend-store-uri {uri}` first" + (f", then open {page}" if page else "")


# MLflow's run page (3.17) draws a chart section per metric prefix (the name up to its last "/"), in name
# order: a stage's one-point summaries (``init.embeddings/...``, ``first.trtd/...``, ``final.trtd/...``)
# sorted before its per-step curves (``embeddings/``, ``mrtd/``, ``trtd/``), some forty single dots ahead of
# the curves a user opened the run for. Under this prefix their sections come after the curves (seen in
# the UI); the manifest and the report keep the bare names.
WINDOW_SECTION = "window"
_ONE_POINT = ("init.", "first.", "final.")


def charted_after_curves(metrics: Mapping[str, float]) -> dict[str, float]:
    """A stage run's metrics as MLflow shows them: the one-point summaries ``init.X/Y`` (at random init),
    ``first.X/Y`` and ``final.X/Y`` (the means of the first and last logged steps) under ``window/``, every
    other name as it is."""
    return {(f"{WINDOW_SECTION}/{k}" if k.startswith(_ONE_POINT) and "/" in k else k): v for k, v in metrics.items()}


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested spec slice -> MLflow params (``a.b.c`` keys, values cut to MLflow's limit)."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        elif isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v):
            for i, x in enumerate(v):
                name = x.get("name", i) if isinstance(x, Mapping) else i
                out.update(flatten(x, f"{key}.{name}."))
        else:
            out[key] = str(v)[:6000]
    return out


def owner() -> str:
    """``host:pid:start``: this process, told apart from a later one with the same pid."""
    import socket

    from xylent.process_identity import mark

    return f"{socket.gethostname()}:{mark()}"


def owner_is_gone(tag: str) -> bool:
    """Whether the process an ``owner()`` tag names has ended (False when unknowable: another host)."""
    import socket

    import psutil

    from xylent.process_identity import same_process

    try:
        host, pid, start = tag.rsplit(":", 2)
        pid, start = int(pid), float(start)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False
    # a tag written before 2026-11-27 holds the wall-clock start (seconds since 1970, ~1.8e9): no
    # process started more seconds after boot than the machine has been up
    if start > time.time() - psutil.boot_time() + 60:
        try:
            return abs(psutil.Process(pid).create_time() - start) > 0.01
        except psutil.NoSuchProcess:
            return True
    return not same_process(pid, start)


# MLflow's UI opens an experiment without this tag in its GenAI view; ours train models.
EXPERIMENT_KIND = "mlflow.experimentKind"

# Where the workspace's own MLflow store writes paths: a copied or moved workspace rewrites them.
_LOCATIONS = (("experiments", "artifact_location"), ("runs", "artifact_uri"), ("model_versions", "source"),
              ("model_versions", "storage_location"), ("logged_models", "artifact_location"))


def relocate_own_store(db: Path, artifact_root: Path) -> str | None:
    """A workspace copied (or moved) with its ``mlflow.db`` still sends artifacts
    to the original's ``mlartifacts/``; point every stored location at this one.
    -> the old artifact root, when it was elsewhere."""
    import sqlite3

    if not db.exists():
        return None
    new = artifact_root.as_uri()
    with contextlib.closing(sqlite3.connect(db, timeout=60)) as con, con:
        rows = con.execute("SELECT artifact_location FROM experiments WHERE artifact_location LIKE 'file://%'")
        olds = {loc.rsplit("/", 1)[0] for (loc,) in rows if loc.rsplit("/", 1)[0].endswith("/mlartifacts")}
        olds.discard(new)
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for old in sorted(olds):
            for table, column in _LOCATIONS:
                if table in tables:
                    pattern = old.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "/%"
                    con.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                                f"WHERE {column} LIKE ? ESCAPE '\\'", (new, len(old) + 1, pattern))
    return ", ".join(sorted(olds)) or None


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xylent"


def store_template(cache: Path | None = None) -> Path | None:
    """A migrated MLflow sqlite store holding nothing yet (not even the Default experiment, which
    MLflow adds when it opens a store without one), made once per MLflow version in
    ``~/.cache/xylent/`` -> its path; None where it cannot be made (a read-only home).

    MLflow creates a new sqlite store by running its whole chain of alembic migrations, seconds
    for every new workspace; a copy of this file is the same store, as MLflow's own test suite
    does it. The template is written under a temporary name and renamed into place, so a
    concurrent first creation only ever sees a whole one."""
    import mlflow
    import sqlalchemy
    from mlflow.store.db import utils as db_utils

    try:
        cache = cache or _cache_dir()
    except RuntimeError:  # no home to cache in (HOME unset, a uid without a passwd entry)
        return None
    path = cache / f"mlflow-{mlflow.__version__}-store-template.db"
    if path.exists():
        return path
    tmp = cache / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
        try:
            db_utils._initialize_tables(engine)  # what SqlAlchemyStore runs on an empty database
            if not db_utils._all_tables_exist(engine):
                return None
            db_utils._verify_schema(engine)  # at this MLflow's head revision
        finally:
            engine.dispose()
        os.replace(tmp, path)
        return path
    except Exception as exc:  # noqa: BLE001 - no template: MLflow creates the store itself, as before
        logging.getLogger(__name__).debug("no MLflow store template in %s: %s", cache, exc)
        return None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def new_store_from_template(db: Path, cache: Path | None = None) -> bool:
    """Put a copy of the store template at ``db`` if no file is there -> whether it did. The copy
    appears whole or not at all (hard-linked into place from a temporary copy), and never over a
    store someone else created meanwhile."""
    if db.exists() or not db.parent.is_dir():
        return False
    template = store_template(cache)
    if template is None:
        return False
    import shutil

    tmp = db.with_name(f".{db.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        shutil.copyfile(template, tmp)
        os.link(tmp, db)  # fails if db exists: a concurrent creator's store is kept
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


class Tracker:
    """Thin wrapper over ``MlflowClient`` bound to one tracking store and experiment."""

    def __init__(self, tracking_uri: str, experiment: str, artifact_root: Path | None = None,
                 workspace: Path | None = None):
        import mlflow
        from mlflow import MlflowClient

        # every run says whose it is, so a later run can tell one whose process died from a live one
        self.owner_tags = {"xylent.owner": owner()}
        if workspace is not None:
            self.owner_tags["xylent.workspace"] = str(workspace)

        # MLflow logs its sqlite migrations at INFO on first use; they are noise to our users.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        # with a tracking server MLflow writes "View run ... at: <url>" to stdout at each run's end, which
        # would break `--json`; the CLI prints the links itself
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        os.environ.setdefault("MLFLOW_PRINT_MODEL_URLS_ON_CREATION", "false")
        # its artifact-download bars would land between the stage's own bars, and in piped output
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        self.uri = tracking_uri
        own_db = artifact_root.parent / "mlflow.db" if artifact_root is not None else None
        if own_db is not None and tracking_uri == f"sqlite:///{own_db}":
            new_store_from_template(own_db)  # a new workspace: its store without MLflow's migrations
            moved_from = relocate_own_store(own_db, artifact_root)
            if moved_from:
                logging.getLogger(__name__).warning("this workspace's MLflow store was copied or moved from "
                                                    "%s: its artifact locations now point to %s", moved_from,
                                                    artifact_root)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        try:
            exp = self.client.get_experiment_by_name(experiment)
            if exp is None:
                try:
                    self.experiment_id = self.client.create_experiment(
                        experiment,
                        artifact_location=(artifact_root / experiment).as_uri() if artifact_root else None,
                        tags={EXPERIMENT_KIND: "custom_model_development"},
                    )
                except mlflow.exceptions.MlflowException:
                    # another process opening the same new store created it between our look and our create
                    exp = self.client.get_experiment_by_name(experiment)
                    if exp is None:
                        raise
                    self.experiment_id = exp.experiment_id
            else:
                self.experiment_id = exp.experiment_id
                if EXPERIMENT_KIND not in exp.tags:
                    self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND, "custom_model_development")
        except mlflow.exceptions.MlflowException as exc:
            raise XylentError(
                f"cannot use the MLflow tracking store: {exc}",
                where=tracking_uri,
                fix="check MLFLOW_TRACKING_URI / tracking.tracking_uri, or unset it to use the workspace's sqlite store",
            ) from None

    def start_run(
        self,
        name: str,
        *,
        parent_run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> str:
        all_tags = {**self.owner_tags, **(tags or {})}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        run_id = run.info.run_id
        if params:
            self.log_params(run_id, params)
        return run_id

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        flat = flatten(redact(dict(params)))
        items = [Param(k, v) for k, v in sorted(flat.items())]
        for i in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [
            Metric(k.replace("=", "_"), float(v), now, step)
            for k, v in sorted(metrics.items())
            if v is not None
        ]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(run_id, k, str(v))

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def end_failed_run(self, run_id: str, status: str = "FAILED") -> None:
        """Mark a run FAILED (or KILLED: stopped by Ctrl-C or SIGTERM) while its failure
        propagates.  When the store itself cannot be written (a full disk, a read-only
        workspace), the original error is what the user must see; the run stays RUNNING
        until the next run on the workspace marks it KILLED (see :meth:`end_orphaned_runs`)."""
        try:
            self.end_run(run_id, status)
        except Exception as exc:  # noqa: BLE001 - reported below, the cause is already on its way up
            from xylent.errors import environment_error

            why = environment_error(exc)
            logging.getLogger(__name__).warning("could not mark MLflow run %s %s: %s", run_id, status,
                                                why.what if why else str(exc).splitlines()[0][:200])

    def end_orphaned_runs(self) -> list[str]:
        """Mark KILLED the RUNNING runs of this workspace whose process is gone
        (a kill -9 never lets a run end itself) -> their ids.  Runs started on
        another host are left alone: whether they live cannot be told from here."""
        where = self.owner_tags.get("xylent.workspace")
        if where is None:
            return []
        runs = self.client.search_runs([self.experiment_id], "attributes.status = 'RUNNING' and "
                                       f"tags.`xylent.workspace` = '{where}'", max_results=1000)
        ended = []
        for run in runs:
            tag = run.data.tags.get("xylent.owner", "")
            if tag and owner_is_gone(tag):
                self.client.set_tag(run.info.run_id, "xylent.ended_by", f"a later run ({owner()}) found its "
                                    "process gone")
                self.client.set_terminated(run.info.run_id, status="KILLED")
                ended.append(run.info.run_id)
        return ended

    def run_url(self, run_id: str) -> str:
        """The run's page, at :func:`ui_base`."""
        return f"{ui_base(self.uri)}/#/experiments/{self.experiment_id}/runs/{run_id}{ML_VIEW}"

    def how_to_view(self) -> str:
        return how_to_view(self.uri)
