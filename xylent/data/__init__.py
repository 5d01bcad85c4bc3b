"""What the training ranks read of the data stages' outputs: the loader, and the shards' and sampling
tables' contracts (below the trainer, so models/ never imports a stage)."""
