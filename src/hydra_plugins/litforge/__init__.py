"""Hydra plugins shipped with litforge (found by Hydra through the hydra_plugins namespace)."""
