"""Markdown tables for stage reports (Prefect artifacts, report.md)."""

from __future__ import annotations


def _cell(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))


def score(v) -> str:
    """A benchmark score as papers print it (one decimal), "–" where there is none."""
    return "–" if v is None else f"{v:.1f}"


def markdown_table(rows: list[dict], limit: int = 200) -> str:
    if not rows:
        return "_no rows_"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows[:limit]:
        lines.append("| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |")
    if len(rows) > limit:
        lines.append(f"\n… {len(rows) - limit} more rows in the MLflow artifact")
    return "\n".join(lines)
