"""Streaming data (`data=streaming`): image shards read as they are needed, from disk or an
object store (LitData), for datasets that outgrow memory or one machine. A feature folder: it
imports the core, nothing in the core imports it (docs/streaming.md)."""
