"""csvlite: a tiny example project."""
