"""The MLflow pyfunc face of an exported encoder: texts in, mean-pooled embeddings out."""

from __future__ import annotations

import mlflow.pyfunc


class EncoderPyfunc(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        from xylent.models.pretrained import load_pretrained

        self.model = load_pretrained(context.artifacts["model"])

    def predict(self, context, model_input: list[str], params: dict | None = None) -> list[list[float]]:
        """Texts -> one mean-pooled embedding (list of floats) per text; params {"layer": k} picks the layer."""
        texts = [str(t) for t in model_input]
        layer = int((params or {}).get("layer", -1))
        return self.model.embed(texts, layer=layer).numpy().tolist()
