"""What produced a run: `<run>/provenance.json` (`callbacks.provenance`, a default callback)."""

from litforge.provenance.record import RecordProvenance, collect

__all__ = ["RecordProvenance", "collect"]
