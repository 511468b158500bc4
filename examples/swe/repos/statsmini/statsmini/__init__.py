"""statsmini: a tiny example project."""
