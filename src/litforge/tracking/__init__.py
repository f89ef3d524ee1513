"""Experiment trackers beyond the core's CSV and TensorBoard: `logger=wandb` (never waits for a
login or the network) and `logger=mlflow` (a local SQLite store by default). A feature: nothing
in the core imports it (docs/tracking.md)."""
