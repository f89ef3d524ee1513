"""Deployment: `predict.py`, `export.py` (ONNX, torch.export) and `serve.py` (HTTP) on a trained
checkpoint. A feature folder: it imports the core, nothing in the core imports it
(docs/deploy.md)."""
