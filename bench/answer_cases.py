"""(reference, answer, equivalent?) cases in the answer styles published math data sets use, and their neighbours.

Generated, not copied: every family below spells one value in the ways MATH, GSM8K, NuminaMath and
model outputs write it (fractions in each LaTeX spelling, decimals, percentages, units, degrees,
`x = 4`, tuples, intervals, sets in any order, matrices, text answers, equations, numbers with
separators) and pairs it with near misses that must not match. `expected` is what a careful
human grader says; bench/graders.py compares the old grader, math-verify and the new grader with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    family: str
    reference: str
    answer: str
    expected: bool


def _same(family: str, reference: str, answers: list[str]) -> Iterator[Case]:
    for answer in answers:
        yield Case(family, reference, answer, True)


def _other(family: str, reference: str, answers: list[str]) -> Iterator[Case]:
    for answer in answers:
        yield Case(family, reference, answer, False)


def _fractions() -> Iterator[Case]:
    for p, q in [(1, 2), (3, 4), (2, 3), (5, 6), (7, 8), (1, 12), (9, 4), (11, 3)]:
        ref = f"\\frac{{{p}}}{{{q}}}"
        spellings = [f"\\dfrac{{{p}}}{{{q}}}", f"\\tfrac{{{p}}}{{{q}}}", f"{p}/{q}", f"\\frac{{{2 * p}}}{{{2 * q}}}"]
        if p < 10 and q < 10:
            spellings.append(f"\\frac{p}{q}")
        if q in (2, 4, 8):
            spellings.append(str(p / q))
        yield from _same("fraction", ref, spellings)
        yield from _same("fraction", f"{p}/{q}", [ref])
        yield from _same("fraction", f"-\\frac{{{p}}}{{{q}}}", [f"\\frac{{-{p}}}{{{q}}}", f"-{p}/{q}"])
        yield from _other(
            "fraction", ref, [f"\\frac{{{q}}}{{{p}}}", f"\\frac{{{p + 1}}}{{{q}}}", f"-\\frac{{{p}}}{{{q}}}"]
        )
        if q not in (2, 4, 8):
            yield from _other("fraction", ref, [f"{p / q:.2f}"])  # rounded to 2 places is not the value


def _decimals() -> Iterator[Case]:
    for value, fraction in [
        ("0.75", "\\frac{3}{4}"),
        ("2.5", "\\frac{5}{2}"),
        ("0.125", "\\frac{1}{8}"),
        ("-1.5", "-\\frac{3}{2}"),
        ("3.2", "\\frac{16}{5}"),
        ("0.05", "\\frac{1}{20}"),
    ]:
        padded = value + "0"
        bare = value.replace("0.", ".", 1) if value.startswith("0.") else value
        yield from _same("decimal", value, [fraction, padded, bare])
        shifted = str(round(float(value) * 10, 6))
        yield from _other("decimal", value, [shifted, str(round(float(value) + 0.01, 6))])
    yield from _same("decimal", "0.3333333333", ["\\frac{1}{3}"])
    yield from _same("decimal", "\\frac{1}{3}", ["0.333333333"])
    yield from _other("decimal", "\\frac{1}{3}", ["0.33", "0.3"])


def _percentages() -> Iterator[Case]:
    for n in (5, 12, 25, 40, 60, 75, 99):
        ref = f"{n}\\%"
        yield from _same("percent", ref, [str(n), f"{n}%", f"{n} \\%", f"{n}\\text{{\\%}}"])
        yield from _same("percent", str(n), [f"{n}\\%"])
        yield from _other("percent", ref, [f"{n + 1}\\%", str(n * 10)])


def _units() -> Iterator[Case]:
    for n, unit in [(5, "cm"), (12, "inches"), (30, "meters"), (7, "hours"), (150, "dollars"), (48, "square feet")]:
        yield from _same("unit", str(n), [f"{n} \\text{{ {unit}}}", f"{n}\\text{{{unit}}}", f"{n}\\ \\text{{{unit}}}"])
        yield from _same("unit", f"{n}\\text{{ {unit}}}", [str(n)])
        yield from _other("unit", str(n), [f"{n + 1} \\text{{ {unit}}}", f"{n * 10}\\text{{ {unit}}}"])
    for n in (5, 18, 250):
        yield from _same("currency", str(n), [f"\\${n}", f"\\${n}.00"])
        yield from _other("currency", str(n), [f"\\${n + 1}"])


def _degrees() -> Iterator[Case]:
    for n in (30, 45, 60, 90, 120, 135):
        ref = f"{n}^\\circ"
        yield from _same("degree", ref, [str(n), f"{n}^{{\\circ}}", f"{n}°", f"{n}^\\circ"])
        yield from _same("degree", str(n), [ref])
        yield from _other("degree", ref, [f"{n + 15}^\\circ", f"{180 - n}^\\circ" if n != 90 else "45^\\circ"])


def _named_values() -> Iterator[Case]:
    for n, var in [(4, "x"), (-3, "x"), (7, "y"), (12, "n"), (2, "k")]:
        yield from _same("x = 4", str(n), [f"{var} = {n}", f"{var}={n}"])
        yield from _same("x = 4", f"{var} = {n}", [str(n), f"{var}={n}"])
        yield from _other("x = 4", str(n), [f"{var} = {n + 1}", f"{var} = -{abs(n) + 2}"])


def _tuples() -> Iterator[Case]:
    for a, b in [(1, 2), (3, -1), (0, 5), (2, 7), (-4, -6)]:
        ref = f"({a}, {b})"
        yield from _same("tuple", ref, [f"({a},{b})", f"\\left({a}, {b}\\right)", f"\\left( {a}, {b} \\right)"])
        yield from _other("tuple", ref, [f"({b}, {a})", f"({a}, {b + 1})", f"({a}, {b}, 0)"])
    yield from _same("tuple", "(1, \\frac{1}{2})", ["(1, 0.5)", "\\left(1, \\dfrac12\\right)"])
    yield from _same("tuple", "(2, -3, 4)", ["(2,-3,4)"])
    yield from _other("tuple", "(2, -3, 4)", ["(2, 3, 4)", "(4, -3, 2)"])


def _intervals() -> Iterator[Case]:
    for a, b in [(1, 3), (-2, 5), (0, 4), (-1, 1)]:
        for lo, hi in ("[)", "(]", "[]"):
            ref = f"{lo}{a}, {b}{hi}"
            sized = f"\\left{lo}{a}, {b}\\right{hi}"
            yield from _same("interval", ref, [f"{lo}{a},{b}{hi}", sized])
            swapped = ("(" if lo == "[" else "[") + f"{a}, {b}" + hi
            yield from _other("interval", ref, [swapped, f"{lo}{a}, {b + 1}{hi}"])
    yield from _same("interval", "(-\\infty, -1] \\cup [3, \\infty)", ["[3, \\infty) \\cup (-\\infty, -1]"])
    yield from _same("interval", "(-\\infty, 2)", ["(-\\infty,2)", "\\left(-\\infty, 2\\right)"])
    yield from _other("interval", "(-\\infty, 2)", ["(-\\infty, 2]", "(2, \\infty)"])


def _sets() -> Iterator[Case]:
    for values in [(1, 2, 3), (-2, 0, 5), (4, 9), (-1, 1), (2, 3, 5, 7)]:
        ref = "\\{" + ", ".join(map(str, values)) + "\\}"
        backwards = list(reversed(values))
        rotated = [*values[1:], values[0]]
        yield from _same(
            "set",
            ref,
            [
                "\\{" + ", ".join(map(str, backwards)) + "\\}",
                "\\{" + ",".join(map(str, rotated)) + "\\}",
                ", ".join(map(str, backwards)),
            ],
        )
        yield from _same("set", ", ".join(map(str, values)), [", ".join(map(str, rotated))])
        yield from _other(
            "set",
            ref,
            [
                "\\{" + ", ".join(map(str, values[:-1])) + "\\}",
                "\\{" + ", ".join(map(str, (*values[:-1], values[-1] + 1))) + "\\}",
            ],
        )


def _matrices() -> Iterator[Case]:
    for a, b, c, d in [(1, 2, 3, 4), (0, -1, 1, 0), (2, 0, 0, 2), (5, 7, -3, 1)]:
        ref = f"\\begin{{pmatrix}} {a} & {b} \\\\ {c} & {d} \\end{{pmatrix}}"
        yield from _same(
            "matrix",
            ref,
            [
                f"\\begin{{bmatrix}} {a} & {b} \\\\ {c} & {d} \\end{{bmatrix}}",
                f"\\begin{{pmatrix}}{a}&{b}\\\\{c}&{d}\\end{{pmatrix}}",
            ],
        )
        yield from _other(
            "matrix",
            ref,
            [
                f"\\begin{{pmatrix}} {a} & {c} \\\\ {b} & {d} \\end{{pmatrix}}"
                if b != c
                else f"\\begin{{pmatrix}} {a} & {b} \\\\ {c} & {d + 1} \\end{{pmatrix}}",
                f"\\begin{{pmatrix}} {a} & {b} \\\\ {c} & {d + 1} \\end{{pmatrix}}",
            ],
        )
    for x, y in [(3, -1), (0, 2), (1, 4)]:
        ref = f"\\begin{{pmatrix}} {x} \\\\ {y} \\end{{pmatrix}}"
        yield from _same("matrix", ref, [f"\\begin{{pmatrix}}{x}\\\\{y}\\end{{pmatrix}}"])
        yield from _other("matrix", ref, [f"\\begin{{pmatrix}} {y} \\\\ {x} \\end{{pmatrix}}"])


def _texts() -> Iterator[Case]:
    for word, other in [("Monday", "Tuesday"), ("east", "west"), ("odd", "even"), ("Sarah", "Sam"), ("blue", "red")]:
        ref = f"\\text{{{word}}}"
        yield from _same("text", ref, [word, word.lower(), f"\\textbf{{{word}}}", f"\\mathrm{{{word}}}"])
        yield from _same("text", word, [ref])
        yield from _other("text", ref, [other, f"\\text{{{other}}}"])
    for letter, other in [("A", "B"), ("C", "D"), ("E", "A")]:
        yield from _same("choice", f"\\text{{({letter})}}", [f"({letter})", letter, f"\\textbf{{({letter})}}"])
        yield from _other("choice", f"\\text{{({letter})}}", [f"({other})", other])


def _equations() -> Iterator[Case]:
    for m, c in [(2, 1), (3, -4), (-1, 5), (1, 0), (4, 2)]:
        rhs = f"{m}x + {c}".replace("+ -", "- ").replace(" + 0", "").replace("1x", "x").replace("-x", "-x")
        ref = f"y = {rhs}"
        yield from _same("equation", ref, [f"y={rhs.replace(' ', '')}", f"{rhs} = y"])
        yield from _other("equation", ref, [f"y = {m}x + {c + 1}", f"y = {m + 1}x + {c}"])
    yield from _same("equation", "x^2 + y^2 = 25", ["y^2 + x^2 = 25", "x^2+y^2=25"])
    yield from _other("equation", "x^2 + y^2 = 25", ["x^2 + y^2 = 5", "x^2 - y^2 = 25"])
    yield from _same("equation", "2x + 3y = 6", ["4x + 6y = 12", "y = 2 - \\frac{2}{3}x"])


def _separators() -> Iterator[Case]:
    for n in (1200, 17500, 1000000, 2048, 45000, 123456):
        grouped = f"{n:,}"
        yield from _same("separator", str(n), [grouped, grouped.replace(",", "{,}"), grouped.replace(",", "\\,")])
        yield from _same("separator", grouped, [str(n)])
        yield from _other("separator", str(n), [f"{n + 1:,}", f"{n // 10:,}"])


def _expressions() -> Iterator[Case]:
    pairs = [
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
        ("3\\sqrt{3}", "\\sqrt{27}"),
        ("\\frac{\\sqrt{3}+1}{2}", "\\frac{1}{\\sqrt{3}-1}"),
        ("9\\pi", "\\pi \\cdot 9"),
        ("\\frac{\\pi}{4}", "\\pi/4"),
        ("2^{10}", "1024"),
        ("1.5 \\times 10^{3}", "1500"),
        ("e^{2}", "\\exp(2)"),
        ("(x+1)^2", "x^2 + 2x + 1"),
        ("\\sqrt[3]{27}", "3"),
        ("\\binom{5}{2}", "10"),
        ("3 + 4i", "4i + 3"),
        ("\\log_2 8", "3"),
    ]
    for ref, same in pairs:
        yield from _same("expression", ref, [same])
    near = [
        ("2\\sqrt{2}", "2\\sqrt{3}"),
        ("\\sqrt{2}", "1.41"),
        ("9\\pi", "3\\pi"),
        ("\\frac{\\pi}{4}", "\\frac{\\pi}{2}"),
        ("2^{10}", "1000"),
        ("(x+1)^2", "x^2 + 1"),
        ("3 + 4i", "4 + 3i"),
        ("e^{2}", "2e"),
    ]
    for ref, other in near:
        yield from _other("expression", ref, [other])


FAMILIES = (
    _fractions,
    _decimals,
    _percentages,
    _units,
    _degrees,
    _named_values,
    _tuples,
    _intervals,
    _sets,
    _matrices,
    _texts,
    _equations,
    _separators,
    _expressions,
)


def cases() -> list[Case]:
    """Every generated case once, in a fixed order (no randomness: the table is reproducible)."""
    return list(dict.fromkeys(case for family in FAMILIES for case in family()))
