"""Physical quantities written as text ("9.8 m/s^2", "3.0 \\times 10^8 m/s", "25 kJ/mol").

A quantity is a number and a unit expression; the unit is reduced to an SI
factor and a dimension vector, so "1 km" and "1000 m" compare equal and
"1 kg" never equals "1 m". The table covers what STEM answers use; an
unknown unit makes the answer unparseable rather than silently unitless.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from shared.errors import RolloutsError

# Dimension exponents over (m, kg, s, A, K, mol, cd).
Dims = tuple[int, int, int, int, int, int, int]
_NONE: Dims = (0, 0, 0, 0, 0, 0, 0)


def _d(m: int = 0, kg: int = 0, s: int = 0, a: int = 0, k: int = 0, mol: int = 0, cd: int = 0) -> Dims:
    return (m, kg, s, a, k, mol, cd)


# name -> (SI factor, dimensions, takes SI prefixes)
_UNITS: dict[str, tuple[float, Dims, bool]] = {
    "m": (1.0, _d(m=1), True),
    "g": (1e-3, _d(kg=1), True),
    "s": (1.0, _d(s=1), True),
    "A": (1.0, _d(a=1), True),
    "K": (1.0, _d(k=1), True),
    "mol": (1.0, _d(mol=1), True),
    "cd": (1.0, _d(cd=1), False),
    "N": (1.0, _d(m=1, kg=1, s=-2), True),
    "J": (1.0, _d(m=2, kg=1, s=-2), True),
    "W": (1.0, _d(m=2, kg=1, s=-3), True),
    "Pa": (1.0, _d(m=-1, kg=1, s=-2), True),
    "Hz": (1.0, _d(s=-1), True),
    "C": (1.0, _d(s=1, a=1), True),
    "V": (1.0, _d(m=2, kg=1, s=-3, a=-1), True),
    "ohm": (1.0, _d(m=2, kg=1, s=-3, a=-2), True),
    "Ω": (1.0, _d(m=2, kg=1, s=-3, a=-2), True),
    "F": (1.0, _d(m=-2, kg=-1, s=4, a=2), True),
    "T": (1.0, _d(kg=1, s=-2, a=-1), True),
    "Wb": (1.0, _d(m=2, kg=1, s=-2, a=-1), True),
    "H": (1.0, _d(m=2, kg=1, s=-2, a=-2), True),
    "L": (1e-3, _d(m=3), True),
    "l": (1e-3, _d(m=3), True),
    "M": (1e3, _d(m=-3, mol=1), True),  # molar: mol/L
    "eV": (1.602176634e-19, _d(m=2, kg=1, s=-2), True),
    "cal": (4.184, _d(m=2, kg=1, s=-2), True),
    "atm": (101325.0, _d(m=-1, kg=1, s=-2), False),
    "bar": (1e5, _d(m=-1, kg=1, s=-2), True),
    "mmHg": (133.322387415, _d(m=-1, kg=1, s=-2), False),
    "torr": (133.322368421, _d(m=-1, kg=1, s=-2), False),
    "min": (60.0, _d(s=1), False),
    "h": (3600.0, _d(s=1), False),
    "hr": (3600.0, _d(s=1), False),
    "day": (86400.0, _d(s=1), False),
    "yr": (3.15576e7, _d(s=1), False),
    "Da": (1.66053906660e-27, _d(kg=1), True),
    "u": (1.66053906660e-27, _d(kg=1), False),
    "Å": (1e-10, _d(m=1), False),
    "angstrom": (1e-10, _d(m=1), False),
    "°C": (1.0, _d(k=1), False),  # differences only: 0 °C != 273.15 K here
    "rad": (1.0, _NONE, False),
    "deg": (math.pi / 180, _NONE, False),
    "°": (math.pi / 180, _NONE, False),
}
_PREFIXES = {
    "Y": 1e24,
    "Z": 1e21,
    "E": 1e18,
    "P": 1e15,
    "T": 1e12,
    "G": 1e9,
    "M": 1e6,
    "k": 1e3,
    "h": 1e2,
    "da": 1e1,
    "d": 1e-1,
    "c": 1e-2,
    "m": 1e-3,
    "µ": 1e-6,
    "μ": 1e-6,
    "u": 1e-6,
    "n": 1e-9,
    "p": 1e-12,
    "f": 1e-15,
    "a": 1e-18,
}

_NUMBER = re.compile(
    r"^\s*(?P<mantissa>[-+−]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
    r"(?:\s*(?:\\times|\\cdot|×|x|\*)\s*10\s*\^\s*[{(]?\s*(?P<exp>[-+−]?\d+)\s*[})]?)?"
)
_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-zµμΩÅ°]+)|(?P<op>[*/^()·])|(?P<num>[-+−]?\d+))")


class UnitError(RolloutsError, ValueError):
    """Text that is not a number with a known unit."""


@dataclass(frozen=True)
class Quantity:
    si_value: float  # the magnitude in SI base units
    dims: Dims
    unit_text: str  # as written ("" when bare)

    @property
    def has_unit(self) -> bool:
        return bool(self.unit_text)


MAX_UNIT_POWER = 12


def parse_quantity(text: str) -> Quantity:
    """``"3.0 x 10^8 m/s"`` -> Quantity(3e8, m s^-1). Raises UnitError (also for values that are not
    finite floats: ``3 x 10^400 m``, ``2 km^999``)."""
    try:
        quantity = _parse_quantity(text)
    except UnitError:
        raise
    except (OverflowError, ValueError) as exc:
        raise UnitError(f"cannot read {text[:80]!r} as a quantity: {exc}") from None
    if not math.isfinite(quantity.si_value):
        raise UnitError(f"{text[:80]!r} is out of range")
    return quantity


def _parse_quantity(text: str) -> Quantity:
    cleaned = _clean(text)
    match = _NUMBER.match(cleaned)
    if not match:
        raise UnitError(f"no number at the start of {text!r}")
    value = float(match.group("mantissa").replace("−", "-"))
    if match.group("exp"):
        value *= 10.0 ** int(match.group("exp").replace("−", "-"))
    unit_text = cleaned[match.end() :].strip()
    factor, dims = parse_unit(unit_text) if unit_text else (1.0, _NONE)
    return Quantity(value * factor, dims, unit_text)


def parse_unit(text: str) -> tuple[float, Dims]:
    """A unit expression (products, quotients, integer powers, parentheses) -> (SI factor, dims)."""
    tokens = _tokenize(text)
    try:
        factor, dims, pos = _product(tokens, 0)
    except (OverflowError, ZeroDivisionError) as exc:
        raise UnitError(f"cannot read unit {text!r}: {exc}") from None
    if pos != len(tokens):
        raise UnitError(f"cannot read unit {text!r}")
    if not math.isfinite(factor) or factor == 0:
        raise UnitError(f"unit {text!r} is out of range")
    return factor, dims


def _clean(text: str) -> str:
    s = text.strip().strip("$").strip()
    s = re.sub(r"\\(?:mathrm|text|textrm|operatorname|mbox)\s*\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\[,;:! ]|~", " ", s)
    s = re.sub(r"\\mu\s*", "µ", s).replace("\\Omega", "Ω").replace("\\AA", "Å").replace("\\circ", "°")
    s = s.replace("^°", "°").replace("{", "(").replace("}", ")").replace("\\cdot", "*")
    return s.strip().rstrip(".")


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise UnitError(f"unexpected {text[pos:]!r} in a unit")
        tokens.append(match.group(match.lastgroup or "name").replace("·", "*").replace("−", "-"))
        pos = match.end()
    return tokens


def _product(tokens: list[str], pos: int) -> tuple[float, Dims, int]:
    factor, dims, pos = _power(tokens, pos)
    while pos < len(tokens) and tokens[pos] != ")":
        divide = tokens[pos] == "/"
        if tokens[pos] in ("*", "/"):
            pos += 1
        f, d, pos = _power(tokens, pos)
        sign = -1 if divide else 1
        factor *= f**sign
        dims = tuple(x + sign * y for x, y in zip(dims, d, strict=True))  # type: ignore[assignment]
    return factor, dims, pos


def _power(tokens: list[str], pos: int) -> tuple[float, Dims, int]:
    if pos >= len(tokens):
        raise UnitError("unit expression ends early")
    token = tokens[pos]
    if token == "(":
        factor, dims, pos = _product(tokens, pos + 1)
        if pos >= len(tokens) or tokens[pos] != ")":
            raise UnitError("unbalanced parenthesis in a unit")
        pos += 1
    elif token.lstrip("-+").isdigit() or token in "*/^)":
        raise UnitError(f"unexpected {token!r} in a unit")
    else:
        factor, dims = _unit(token)
        pos += 1
    exponent = None
    if pos < len(tokens) and tokens[pos] == "^":
        pos += 1
        if pos < len(tokens) and tokens[pos] == "(":  # ^{-2}
            if pos + 2 < len(tokens) and tokens[pos + 2] == ")":
                exponent, pos = tokens[pos + 1], pos + 3
        elif pos < len(tokens):
            exponent, pos = tokens[pos], pos + 1
        if exponent is None or not exponent.lstrip("-+").isdigit():
            raise UnitError("a unit power must be an integer")
    elif pos < len(tokens) and tokens[pos].lstrip("-+").isdigit():  # "m2", "s-1"
        exponent, pos = tokens[pos], pos + 1
    if exponent is not None:
        n = int(exponent)
        if abs(n) > MAX_UNIT_POWER:
            raise UnitError(f"a unit power of {n} (at most {MAX_UNIT_POWER})")
        factor, dims = factor**n, tuple(x * n for x in dims)  # type: ignore[assignment]
    return factor, dims, pos


def _unit(name: str) -> tuple[float, Dims]:
    if name in _UNITS:
        factor, dims, _ = _UNITS[name]
        return factor, dims
    for prefix in sorted(_PREFIXES, key=len, reverse=True):
        base = name[len(prefix) :]
        if name.startswith(prefix) and base in _UNITS and _UNITS[base][2]:
            factor, dims, _ = _UNITS[base]
            return _PREFIXES[prefix] * factor, dims
    raise UnitError(f"unknown unit {name!r}")


def same_quantity(answer: Quantity, reference: Quantity, rel_tol: float) -> bool:
    """Equal dimensions and SI magnitudes within `rel_tol` (a bare number takes the reference's unit)."""
    if not answer.has_unit and reference.has_unit:
        factor, dims = parse_unit(reference.unit_text)
        answer = Quantity(answer.si_value * factor, dims, reference.unit_text)
    if answer.dims != reference.dims:
        return False
    return math.isclose(answer.si_value, reference.si_value, rel_tol=rel_tol, abs_tol=1e-300)
