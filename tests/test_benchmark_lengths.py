"""Input/output length distributions: the ``in=``/``out=`` forms, their errors, bounds and determinism."""

from __future__ import annotations

import pytest

from workers.benchmark.lengths import Fixed, FromDataset, UniformRange, parse_length, sample_lengths
from workers.errors import BenchbotError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", Fixed(1024)),
        (" 7 ", Fixed(7)),
        ("512-2048", UniformRange(512, 2048)),
        ("512..2048", UniformRange(512, 2048)),
        ("512–2048", UniformRange(512, 2048)),  # an en dash, as a phone or macOS types it
        ("100-100", Fixed(100)),
        ("dataset", FromDataset()),
        ("DATASET", FromDataset()),
    ],
)
def test_length_forms(text, expected):
    assert parse_length(text, "in") == expected


def test_describe_round_trips():
    for text in ("1024", "512-2048", "dataset"):
        assert parse_length(parse_length(text).describe()) == parse_length(text)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "needs a number of tokens"),
        ("abc", r"in=abc is not a length: write in=1024 \(fixed\) or in=512-2048"),
        ("0", "at least 1 token"),
        ("-5", "at least 1 token"),
        ("2048-512", "from low to high, e.g. in=512-2048"),
        ("2k", r"write the number of tokens in full, e.g. in=2048"),
        ("200000", "at most 131072 tokens"),
        ("1-200000", "at most 131072 tokens"),
        ("99999999999", "at most"),
        ("1.5", "is not a length"),
    ],
)
def test_length_errors_say_how_to_write_it(text, needle):
    with pytest.raises(BenchbotError, match=needle):
        parse_length(text, "in", max_tokens=131072)


def test_error_names_the_option_it_was_given():
    with pytest.raises(BenchbotError, match=r"^out=x is not a length: write out=1024"):
        parse_length("x", "out")


def test_fixed_and_uniform_draws_stay_in_bounds_and_repeat_by_seed():
    assert sample_lengths(Fixed(64), 5, seed=1) == (64,) * 5
    dist = UniformRange(10, 13)
    draws = sample_lengths(dist, 4000, seed=9)
    assert set(draws) == {10, 11, 12, 13}  # both ends included
    assert sum(draws) / len(draws) == pytest.approx(dist.mean, abs=0.1)
    for value in (10, 13):
        assert draws.count(value) / len(draws) == pytest.approx(0.25, abs=0.03)
    assert draws == sample_lengths(dist, 4000, seed=9)
    assert draws != sample_lengths(dist, 4000, seed=10)


def test_input_and_output_streams_are_independent():
    dist = UniformRange(1, 1000)
    ins = sample_lengths(dist, 50, seed=5, stream="in")
    outs = sample_lengths(dist, 50, seed=5, stream="out")
    assert ins != outs
    assert sample_lengths(dist, 20, seed=5, stream="in") == ins[:20]  # a prefix of the same stream


def test_dataset_lengths_need_the_dataset():
    assert sample_lengths(FromDataset(), 3, seed=0, dataset_lengths=[5, 0, 7]) == (5, 1, 7)
    with pytest.raises(BenchbotError, match="needs a dataset: name one with data=NAME"):
        sample_lengths(FromDataset(), 3, seed=0, stream="out")
