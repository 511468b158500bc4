"""Rows as the public data sets publish them (GSM8K, MATH, NuminaMath, DeepScaleR, MBPP, HumanEval),
each with its own fields and reference, for tests of formats and of `rollouts validate`."""

from __future__ import annotations

GSM8K = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
    "altogether in April and May.\n#### 72",
}
GSM8K_THOUSANDS = {"question": "How many meters are in 1.2 km?", "answer": "1.2 * 1000 = 1200\n#### 1,200"}
MATH = {
    "problem": "What is $\\frac{1}{2} \\cdot \\frac{1}{3}$ as a fraction over $\\sqrt{36}$?",
    "level": "Level 1",
    "type": "Prealgebra",
    "solution": "We have $\\frac{1}{2}\\cdot\\frac{1}{3} = \\frac{1}{6}$, so the answer is "
    "$\\boxed{\\frac{1}{\\sqrt{36}}}$.",
}
NUMINA = {"problem": "Compute $6 \\times 7$.", "solution": "$6 \\times 7 = 42$.", "answer": "42", "source": "amc"}
DEEPSCALER = {"problem": "What is $2^{10}$?", "answer": "1024", "solution": "$2^{10} = 1024$."}
MBPP = {
    "task_id": 2,
    "text": "Write a function to find the shared elements from the given two lists.",
    "code": "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & set(test_tup2))\r\n"
    "  return (res) ",
    "test_list": [
        "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
        "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
    ],
    "test_setup_code": "",
    "challenge_test_list": [],
}
HUMANEVAL = {
    "task_id": "HumanEval/0",
    "prompt": "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
    '    given threshold.\n    """\n',
    "canonical_solution": "    for idx, elem in enumerate(numbers):\n        for idx2, elem2 in enumerate(numbers):\n"
    "            if idx != idx2:\n                distance = abs(elem - elem2)\n"
    "                if distance < threshold:\n                    return True\n\n    return False\n",
    "test": "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\ndef check(candidate):\n"
    "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n"
    "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n",
    "entry_point": "has_close_elements",
}
