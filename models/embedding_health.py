"""How healthy the shared token embeddings are, at each checkpoint (issue 63, item 2).

The demo's ELECTRA weights showed the token embeddings collapsing: the top principal
component held 52 % of their variance (1.8 % at random init), and rows of tokens never
input grew from norm ≈ 0.16 to 1.75 along one common direction (cosine 0.93), moved by
the generator's tied softmax and scaled up by Adam.  These three numbers say whether a
run is going that way; the trainer writes them for step 0 (the random-init peer) and
every checkpoint, to ``embedding_health.jsonl`` beside metrics.jsonl and to MLflow.
"""

from __future__ import annotations

FILE = "embedding_health.jsonl"  # the pretrain stage's contract names it; importing this module loads no torch


def embedding_health(weight, seen) -> dict[str, float]:
    """``weight``: (V, H) token embeddings; ``seen``: (V,) bool, True for the tokens the run has
    input so far (special tokens count as seen).  Returns
    - ``top_pc_share``: the top principal component's share of the rows' variance;
    - ``unseen_rows``, ``unseen_mean_norm``, ``unseen_cos_to_mean``: how many rows were never input,
      their mean L2 norm and their mean cosine to their own mean direction;
    - ``seen_mean_norm``: the same norm for the rows that were (the scale to read the others by)."""
    import torch

    w = weight.detach().to("cpu", torch.float64)
    centred = w - w.mean(0, keepdim=True)
    variances = torch.linalg.eigvalsh(centred.T @ centred)  # (H, H): cheap at any vocabulary size
    total = float(variances.sum())
    out = {"top_pc_share": float(variances[-1]) / total if total > 0 else 0.0}
    seen = seen.to("cpu", torch.bool)
    unseen = w[~seen]
    out["unseen_rows"] = float(unseen.shape[0])
    if unseen.shape[0]:
        norms = unseen.norm(dim=1)
        mean = unseen.mean(0)
        cos = (unseen @ mean) / (norms * mean.norm()).clamp(min=1e-12)
        out["unseen_mean_norm"], out["unseen_cos_to_mean"] = float(norms.mean()), float(cos.mean())
    out["seen_mean_norm"] = float(w[seen].norm(dim=1).mean()) if bool(seen.any()) else 0.0
    return out
