"""Closed integer intervals."""


def merge(intervals):
    """Merge overlapping closed intervals; returns a sorted list of (start, end)."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
