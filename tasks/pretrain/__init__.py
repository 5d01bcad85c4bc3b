"""pretrain stage logic: launching ranks, exporting the model, loss plots."""
