"""Imported once by the equivalence checks' forkserver: one check of each answer shape, so the children it forks
start with what math-verify and sympy import lazily (parsers, simplify, sets, matrices) already loaded.

Without it every check, in a fresh child, paid those imports again (about 0.1 s a check).
"""

from __future__ import annotations

from workers.eval.math_equiv import compare

WARM_UP = (
    ("\\frac{1}{2}", "0.5"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("x = 4", "4"),
    ("[1, 3)", "[1,3)"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),
    ("(1, 2)", "(1,2)"),
    ("y = 2x + 1", "2x - y + 1 = 0"),
    ("12\\%", "12"),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}"),
    ("\\text{Monday}", "monday"),
    ("30^\\circ", "30"),
    ("3 + 4i", "4i + 3"),
    ("(x+1)^2", "x^2 + 2x + 1"),
)

for _answer, _reference in WARM_UP:
    compare(_answer, _reference)
