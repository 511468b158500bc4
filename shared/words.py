"""The base of the service's vocabulary enums (statuses, results, reasons): a str enum printed as its value."""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A str enum: members compare equal to, and are stored in Redis and JSON as, their values."""

    def __str__(self) -> str:
        # The value, as 3.11's StrEnum gives (3.10 is supported): words go into f-strings and logs.
        return self.value
