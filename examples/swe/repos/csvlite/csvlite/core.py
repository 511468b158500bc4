"""A tiny CSV row splitter."""


def split_row(line: str) -> list:
    """Split one CSV line into its fields."""
    return [field.strip() for field in line.split(",")]
