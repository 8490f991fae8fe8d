"""Eval tasks: the generated task is deterministic and right; a team's JSONL loads, or fails clearly."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from workers.errors import BenchbotError
from workers.evaluation.tasks import (
    BUILTIN,
    DEFAULT_N,
    MAX_N,
    TaskError,
    TaskFile,
    builtin_task,
    load_jsonl_task,
    load_task,
    parse_builtin,
    task_names,
)

ARITH = re.compile(r"^What is (\d+) ([+*]) (\d+)\? Answer with the final number\.$")


def _write(path: Path, lines: list[object | str]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


# ------------------------------------------------------------------------------------------ builtin


def test_builtin_task_is_the_same_for_the_same_seed_and_differs_for_another() -> None:
    a, b, other = builtin_task(60, seed=0), builtin_task(60, seed=0), builtin_task(60, seed=1)
    assert a.items == b.items and a.fingerprint == b.fingerprint
    assert [i.prompt for i in a.items] != [i.prompt for i in other.items] and a.fingerprint != other.fingerprint
    # pinned: the generator must not drift between processes or Python runs (string seeds hash with SHA-512)
    assert a.items[0].prompt == "What is 711913 + 362676? Answer with the final number."
    assert a.items[1].expected == str(50 * 578)


def test_a_smaller_run_asks_the_first_questions_of_a_larger_one() -> None:
    assert builtin_task(100).items == builtin_task(DEFAULT_N).items[:100]


def test_builtin_mixes_addition_multiplication_and_copy_with_correct_answers() -> None:
    task = builtin_task(DEFAULT_N, seed=7)
    assert len(task) == DEFAULT_N and len({i.id for i in task.items}) == DEFAULT_N
    assert Counter(i.kind for i in task.items) == {"add": 100, "mul": 100, "copy": 100}
    for item in task.items:
        if item.kind == "copy":
            assert item.method == "exact" and item.prompt.endswith("\n" + item.expected)
            assert 4 <= len(item.expected.split()) <= 6
        else:
            m = ARITH.match(item.prompt)
            assert m and item.method == "number", item.prompt
            a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
            assert item.expected == str(a + b if op == "+" else a * b)
            assert a >= 10 and b >= 10  # multi-digit operands
        assert parse_builtin(item.prompt) == (item.kind, item.expected)


def test_parse_builtin_finds_the_question_inside_a_template_and_ignores_other_text() -> None:
    wrapped = "<|im_start|>user\nWhat is 12 * 34? Answer with the final number.<|im_end|>\n<|im_start|>assistant\n"
    assert parse_builtin(wrapped) == ("mul", "408")
    assert parse_builtin("The capital of France is") is None
    assert parse_builtin("What is 12 - 34? Answer with the final number.") is None


@pytest.mark.parametrize("n", [0, -3, MAX_N + 1, True, 2.5])
def test_bad_n_is_refused_with_the_allowed_range(n: object) -> None:
    with pytest.raises(TaskError, match=f"between 1 and {MAX_N}"):
        builtin_task(n)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ JSONL


def test_jsonl_task_reads_questions_answers_regexes_and_gsm8k_solutions(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "team.jsonl",
        [
            {"question": "Janet has 3 ducks...", "answer": "She has 3 + 4 = 7 ducks.\n#### 7"},
            "",
            {"question": "Capital of France?", "answer": "Paris"},
            {"question": "How many legs?", "answer": 4},
            {"question": "Pick a letter", "answer": "B", "regex": r"answer is \(?([A-D])\)?"},
        ],
    )
    task = load_jsonl_task(path, name="team")
    assert [i.id for i in task.items] == ["line-1", "line-3", "line-4", "line-5"]
    assert [(i.expected, i.method) for i in task.items] == [
        ("7", "number"),
        ("Paris", "exact"),
        ("4", "number"),
        ("B", "regex"),
    ]
    assert task.items[3].pattern == r"answer is \(?([A-D])\)?"
    assert task.name == "team" and "all of 4 questions" in task.source and str(path) in task.source


def test_jsonl_subset_is_seeded_nested_and_in_file_order(tmp_path: Path) -> None:
    path = _write(tmp_path / "big.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(200)])
    small, large = load_jsonl_task(path, n=20), load_jsonl_task(path, n=80)
    assert len(small) == 20 and set(small.items) <= set(large.items)
    assert load_jsonl_task(path, n=20).items == small.items
    assert load_jsonl_task(path, n=20, seed=1).items != small.items
    lines = [int(i.id.split("-")[1]) for i in small.items]
    assert lines == sorted(lines) and lines != list(range(1, 21))  # not just the head of the file
    assert len(load_jsonl_task(path, n=500)) == 200  # more than there are: all of them


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"question": "q", "answer": "1"}\n{"question": "q2", "answer": \n', "line 2: not JSON"),
        (b'["q", "a"]\n', "line 1: expected a JSON object, got list"),
        (b'{"answer": "1"}\n', 'line 1: "question" must be a non-empty string'),
        (b'{"question": "  ", "answer": "1"}\n', 'line 1: "question" must be a non-empty string'),
        (b'{"question": "q", "answer": true}\n', 'line 1: "answer" must be a string or a number'),
        (b'{"question": "q", "answer": "#### "}\n', 'line 1: "answer" is empty'),
        (b'{"question": "q", "answer": "1", "regex": "(unclosed"}\n', "does not compile"),
        (b'{"question": "q", "answer": "1", "regex": "(a)(b)"}\n', "has 2 groups"),
        (b'{"question": "q", "answer": "1", "regex": 5}\n', '"regex" must be a non-empty string'),
        (b'{"question": "caf\xe9", "answer": "1"}\n', "line 1: not UTF-8 text"),
        (b"\n\n", "has no questions"),
    ],
)
def test_bad_jsonl_files_fail_with_the_line_and_the_problem(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(TaskError, match=re.escape(needle)) as info:
        load_jsonl_task(path, name="mine")
    assert isinstance(info.value, BenchbotError) and "task 'mine'" in str(info.value)


def test_many_bad_lines_are_summarised(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.jsonl", ["nope"] * 9)
    with pytest.raises(TaskError, match=r"has 9 bad lines: line 1: not JSON.*\(and 4 more\)"):
        load_jsonl_task(path)


def test_missing_file_and_directory_are_named(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="does not exist on this worker"):
        load_jsonl_task(tmp_path / "absent.jsonl")
    with pytest.raises(TaskError, match="is not a file"):
        load_jsonl_task(tmp_path)


# ------------------------------------------------------------------------------------------ registry


def test_registry_loads_builtin_and_configured_files(tmp_path: Path) -> None:
    path = _write(tmp_path / "gsm8k_test.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    files = {"gsm8k": TaskFile(path, max_tokens=2048), "mine": str(path)}
    assert task_names(files) == [BUILTIN, "gsm8k", "mine"]
    assert load_task().items == builtin_task().items and len(load_task(None)) == DEFAULT_N
    assert len(load_task("builtin", n=12, seed=3)) == 12
    gsm = load_task("GSM8K", files=files)
    assert gsm.name == "gsm8k" and gsm.max_tokens == 2048 and gsm.items[0].expected == "2"
    assert load_task("mine", files=files).max_tokens == 1024


def test_registry_refuses_unknown_reserved_and_malformed_names(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"unknown task 'mmlu'; known: builtin, gsm8k"):
        load_task("mmlu", files={"gsm8k": tmp_path / "x.jsonl"})
    with pytest.raises(TaskError, match="reserved"):
        task_names({"builtin": tmp_path / "x.jsonl"})
    with pytest.raises(TaskError, match="short lowercase word"):
        task_names({"My Task!": tmp_path / "x.jsonl"})


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (b'{"question": "q", "answer": NaN}', "line 1: NaN is not JSON"),
        (b'{"question": "q", "answer": -Infinity}', "line 1: -Infinity is not JSON"),
        (b'{"question": "q", "answer": 1e999}', 'line 1: "answer" inf is not a finite number'),
        (b'{"question": "q", "answer": "NaN"}', "line 1: \"answer\" 'NaN' is not a finite number"),
        (b'{"question": "q", "answer": "#### inf"}', "\"answer\" 'inf' is not a finite number"),
        (b'{"question": "q", "answer": "1e999"}', "\"answer\" '1e999' is too large to compare"),
        (b'{"question": "q", "answer": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "line 1: nested too deeply"),
    ],
)
def test_answers_no_reply_can_match_and_deep_nesting_are_refused_when_the_task_loads(
    tmp_path: Path, line: bytes, needle: str
) -> None:
    """Issue 25 item 7: NaN/inf/1e999 answers were accepted and could never match; a deeply nested line
    was "internal error: RecursionError"."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(line + b"\n")
    with pytest.raises(TaskError, match=re.escape(needle)):
        load_jsonl_task(path, name="mine")


def test_fullwidth_digits_are_not_a_numeric_answer(tmp_path: Path) -> None:
    path = _write(tmp_path / "ok.jsonl", [{"question": "q", "answer": "１２"}, {"question": "r", "answer": "12"}])
    methods = {item.expected: item.method for item in load_jsonl_task(path).items}
    assert methods == {"１２": "exact", "12": "number"}
