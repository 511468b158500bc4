"""numerals: a tiny example project."""
