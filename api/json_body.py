"""Request bodies parsed the one way: JSON whose shape the service can store and give back exactly.

Two things JSON allows break later, far from the request that caused them: nesting deep enough to
overflow a recursive encoder (msgpack into Redis, orjson on the way out: a 500 on read, long after
the 202), and integers past 64 bits, which orjson reads as floats (the job would come back with a
different number than was sent). Both are refused here, naming the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from shared.errors import Loc, ValidationError

# The integers that msgpack (Redis) and orjson (responses) both keep exactly.
INT_MIN = -(2**63)
INT_MAX = 2**64 - 1

# 19+ digits in a row can be an integer outside the exact range (-2**63 - 1 has 19). Only then is
# the body parsed again by the standard library, which keeps every integer exact; a match inside a
# string costs that second parse and nothing else.
_LONG_DIGITS = re.compile(rb"\d{19,}")


class MalformedJSON(ValidationError):
    """A body that is not JSON at all: a 400, not a 422 (nothing in it could be checked)."""


def load_json_body(raw: bytes, max_depth: int, loc: Loc = ("body",)) -> Any:
    """The parsed body, or a ValidationError naming where it nests too deep or holds an inexact integer."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # orjson's own limit (1024) is deeper than ours: the same refusal
            raise ValidationError(f"nested more than {max_depth} levels deep", loc) from None
        raise MalformedJSON(f"malformed JSON: {exc}", loc) from None
    check_shape(body, max_depth, loc)  # first: the second parse below must not meet a deep body
    if _LONG_DIGITS.search(raw):
        body = json.loads(raw)  # integers exact, to be checked against the range
        check_shape(body, max_depth, loc)
    return body


def check_shape(value: Any, max_depth: int, loc: Loc = ("body",)) -> None:
    """Refuse containers nested more than `max_depth` deep and integers outside [INT_MIN, INT_MAX].

    Iterative, so that the check itself cannot overflow the stack it protects."""
    stack: list[tuple[Any, Loc, int]] = [(value, loc, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.items()
        elif isinstance(item, list):
            children = enumerate(item)
        else:
            if isinstance(item, int) and not isinstance(item, bool) and not INT_MIN <= item <= INT_MAX:
                raise ValidationError(f"integer out of range: JSON integers must lie in [{INT_MIN}, {INT_MAX}]", where)
            continue
        if depth >= max_depth:
            raise ValidationError(f"nested more than {max_depth} levels deep", where)
        stack.extend((child, (*where, key), depth + 1) for key, child in children)
