"""spans: a tiny example project."""
