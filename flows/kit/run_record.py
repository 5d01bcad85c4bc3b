"""What an MLflow run records so that two runs compare on what changed: names
that carry the spec and the fingerprint, the full effective configuration (the
whole spec, model presets resolved, and the fingerprints of every upstream
stage), the source (git commit, spec file), the stage outputs it read as MLflow
dataset inputs, and headline numbers for the parent run."""

from __future__ import annotations

import functools
import logging
import os
import re
import subprocess
from pathlib import Path

from xylent.redact import redact_text
from xylent.spec import Spec

# per stage, the metrics that say how it went at a glance (parent run, closing table)
_HEADLINES = {
    "download": r"bytes|files",
    "prepare": r"(mono|bitext)\.rows",
    "dedup": r"(mono|bitext)\.out",
    "vocab": r"vocab_size",
    "sampling": r"entropy\.star",
    "shards": r"(mrtd|trtd)\.tokens",
    "pretrain": r"final\.\w+/(generator|discriminator)_loss|final\.\w+/discriminator_base_loss|loss_final",
    "evaluate": r"eval/[^/]+/avg",
    "audit": r"pairs|.*q_final_max.*",
}


def headline(stage: str, metrics: dict) -> dict[str, float]:
    pattern = re.compile(_HEADLINES.get(stage, r"(?!)"))
    return {k: v for k, v in sorted(metrics.items()) if pattern.fullmatch(k) and v is not None}


# short labels for the closing table: "trtd D" not "final.trtd/discriminator_loss"
_LABELS = [
    (r"final\.(\w+)/discriminator_loss", r"\1 D"), (r"final\.(\w+)/discriminator_base_loss", r"\1 D base"),
    (r"final\.(\w+)/generator_loss", r"\1 G"), (r"eval/([^/]+)/avg", r"\1"),
    (r"(mono|bitext)\.(rows|out)", r"\1"), (r"(\w+)\.tokens", r"\1 tokens"), (r"entropy\.star", "entropy P*"),
    (r"vocab_size", "vocab"), (r"loss_final", "loss"),
]


def headline_text(stage: str, metrics: dict, short=lambda v: f"{v:.4g}") -> str:
    """A stage's headline numbers for a terminal cell, one line per group (a pretraining
    task, an evaluation task): short labels, the trivial baseline beside what it bounds."""
    labelled = {}
    for key, value in headline(stage, metrics).items():
        label = next((re.sub(p, r, key) for p, r in _LABELS if re.fullmatch(p, key)), key)
        labelled[label] = value
    lines = []
    for label, value in labelled.items():
        if label.endswith(" D base") and label[:-5] in labelled:
            continue  # shown beside the loss it bounds
        base = labelled.get(f"{label} base")
        lines.append(f"{label} {short(value)}" + (f" (base {short(base)})" if base is not None else ""))
    return "\n".join(lines)


def run_name(spec: Spec, target: str, fingerprint: str | None, overrides: list[str] | None = None, *,
             until: str | None = None, force: bool = False, cached: bool = False) -> str:
    """``cached pipeline→shards 3f9a1c2e demo [sampling.temperature=5]``: what kind of run, what it
    built and its fingerprint first (what a truncated run table keeps), then the spec and the
    overrides.  A forced rebuild, a partial run and a cached rerun of the same spec read apart."""
    flag = "cached " if cached else "forced " if force else ""
    name = f"{flag}{target}" + (f"→{until}" if until else "") + (f" {fingerprint[:8]}" if fingerprint else "")
    name += f" {spec.name}"
    if overrides:
        shown = redact_text(" ".join(overrides))  # a URI's password must not reach a run's name
        name += f" [{shown if len(shown) <= 80 else shown[:77] + '...'}]"
    return name


def override_tags(overrides: list[str] | None) -> dict[str, str]:
    """``--set a.b=v`` as the tag ``xylent.set.a.b = v``: runs are found by what they changed
    (``tags."xylent.set.pretrain.lr" = '0.001'``)."""
    out = {}
    for item in overrides or []:
        key, _, value = item.partition("=")
        out[f"xylent.set.{key.strip()}"] = redact_text(value.strip())
    return out


def effective_params(spec: Spec, fingerprint: str, upstream: dict[str, str]) -> dict:
    """The whole spec as it ran (a changed upstream knob shows in every later stage's
    run), the model's preset resolved to numbers, and the upstream fingerprints."""
    from xylent.models.config import preset

    params = spec.dump()
    body = preset(spec.model.size, **spec.model.overrides()).to_dict()
    params["model"] = {"size": spec.model.size, **{k: v for k, v in body.items()
                                                   if isinstance(v, (int, float, str, bool))}}
    return {**params, "fingerprint": fingerprint, "upstream": dict(sorted(upstream.items()))}


def source_tags(spec_file: str, repo: Path | None = None) -> dict[str, str]:
    """MLflow's own source tags (shown in its UI): the spec file and the code's git commit --
    from the checkout, or, where there is none (the image: .git stays out of it), from
    ``$XYLENT_GIT_COMMIT``, which the image is built with."""
    repo = repo or Path(__file__).resolve().parents[2]
    tags = {"mlflow.source.name": str(Path(spec_file).resolve()), "mlflow.source.type": "LOCAL"}
    commit = dirty = ""
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass  # no git here
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["xylent.git_dirty"] = str(bool(dirty)).lower()
    elif os.environ.get("XYLENT_GIT_COMMIT", "").strip() not in ("", "unknown"):
        tags["mlflow.source.git.commit"] = os.environ["XYLENT_GIT_COMMIT"].strip()
        tags["xylent.git_dirty"] = "unknown"  # built from a tree git did not describe to us
    else:
        tags["xylent.code_version"] = "unknown"
        _say_the_code_version_is_unknown()
    return tags


@functools.cache  # once a process: a worker runs many flows
def _say_the_code_version_is_unknown() -> None:
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    text = ("this run records no code version: there is no git checkout here and the image was built "
            "without XYLENT_GIT_COMMIT; build it with `make compose-up` (or XYLENT_GIT_COMMIT=$(git rev-parse "
            "HEAD) docker compose ... build) so that runs can be traced to their code")
    try:
        get_run_logger().warning(text)
    except MissingContextError:
        logging.getLogger("xylent").warning(text)


def log_stage_inputs(client, run_id: str, upstream: dict[str, tuple[Path, str]]) -> None:
    """Each upstream stage output a stage read, as an MLflow dataset input
    (name = the stage, digest = its fingerprint, source = its folder)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    if not upstream:
        return
    inputs = [DatasetInput(Dataset(name=stage, digest=fp[:36], source_type="local", source=str(out)),
                           tags=[InputTag("mlflow.data.context", "training" if stage == "shards" else stage)])
              for stage, (out, fp) in sorted(upstream.items())]
    client.log_inputs(run_id, datasets=inputs)


def log_spec_file(tracker, run_id: str, spec_file: Path) -> None:
    """The spec as written, with any password in a URL masked (it is used, never recorded)."""
    import tempfile

    from xylent.redact import redact_text

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / spec_file.name
        copy.write_text(redact_text(spec_file.read_text(encoding="utf-8")), encoding="utf-8")
        tracker.log_artifact(run_id, copy)
