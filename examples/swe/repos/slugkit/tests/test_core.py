from slugkit.core import slugify


def test_simple_word():
    assert slugify("hello") == "hello"


def test_lowercases():
    assert slugify("ABC") == "abc"
