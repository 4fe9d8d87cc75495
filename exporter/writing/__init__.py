"""Tracing per rank, the distributed export job, and writing the export."""
