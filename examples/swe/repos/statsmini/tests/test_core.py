from statsmini.core import mean, median


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median_sorted_odd():
    assert median([1, 2, 3]) == 2
