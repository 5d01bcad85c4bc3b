"""MLflow's models-from-code entry for an exported encoder (tasks/pretrain/publish.py):
MLflow runs this file to build the pyfunc, at save time and wherever the model is
loaded, instead of unpickling an object (what it warns about)."""

import mlflow.models

from xylent.models.serving import EncoderPyfunc

mlflow.models.set_model(EncoderPyfunc())
