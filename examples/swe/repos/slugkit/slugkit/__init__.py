"""slugkit: a tiny example project."""
