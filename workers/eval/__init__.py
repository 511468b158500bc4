"""Eval stage: scores each trajectory on a fresh copy of its state, then cleans up."""
