"""`rollouts validate --answers`: the lines of a model's answers become `given` jobs; bad lines name the field."""

from __future__ import annotations

from click.testing import CliRunner

from cli.validate import answer_jobs, validate
from tests.support.published_rows import GSM8K, MBPP


def test_each_line_becomes_a_given_job_on_its_published_row() -> None:
    jobs, problems = answer_jobs([{"row": GSM8K, "output": "The answer is 72."}, {"row": MBPP, "output": "x"}], None)
    assert problems == {}
    assert jobs[0]["given"] == {"output": "The answer is 72."} and jobs[0]["task"]["format"] == "gsm8k"
    assert jobs[1]["task"]["kind"] == "code" and jobs[1]["given"] == {"output": "x"}


def test_bad_lines_name_the_field() -> None:
    lines = [{"output": "1"}, {"row": GSM8K, "output": 72}, {"row": {"title": "x"}, "output": "1"}]
    _, problems = answer_jobs(lines, None)
    assert "`row`: required" in problems[0] and "`output`: required, a string" in problems[1]
    assert problems[2].startswith("`row`: matches no known format")


def test_a_data_file_or_answers_not_both(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "rows.jsonl"
    data.write_text("{}\n")
    for args in ([], [str(data), "--answers", str(data)]):
        result = CliRunner().invoke(validate, args)
        assert result.exit_code == 2 and "--answers FILE, not both" in result.output
