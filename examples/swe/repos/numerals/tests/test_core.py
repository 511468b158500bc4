from numerals.core import from_roman


def test_additive():
    assert from_roman("XVII") == 17


def test_lowercase():
    assert from_roman("mmx") == 2010
