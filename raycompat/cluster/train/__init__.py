"""Ray Train: the TorchTrainer driver, the per-worker loops (models and FCT), checkpoints."""
