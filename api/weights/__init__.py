"""Policy weights: update every backend of a model, declare a trainer's own, read the current version."""
