from csvlite.core import split_row


def test_plain_fields():
    assert split_row("a,b,c") == ["a", "b", "c"]


def test_strips_spaces():
    assert split_row(" a , b ") == ["a", "b"]
