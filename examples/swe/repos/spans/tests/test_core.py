from spans.core import merge


def test_disjoint_stay_apart():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_overlapping_merge():
    assert merge([(1, 4), (2, 3), (3, 8)]) == [(1, 8)]
