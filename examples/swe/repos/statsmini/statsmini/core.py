"""Small statistics helpers."""


def mean(values):
    return sum(values) / len(values)


def median(values):
    """The middle value of `values`."""
    return values[len(values) // 2]
