"""Batches: create, read, stream completed groups, cancel; the router over shared/batches/."""
