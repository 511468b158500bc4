"""Roman numerals."""

VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def from_roman(numeral: str) -> int:
    """The integer value of a Roman numeral."""
    return sum(VALUES[char] for char in numeral.upper())
