"""bench/arg_types.py: the bench scripts' comma-separated numbers, and a bad one refused by argparse naming its
option instead of a traceback."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from arg_types import comma_separated, key_value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench")
    p.add_argument("--rates", type=comma_separated(float), default=[1000.0])
    p.add_argument("--sizes", type=comma_separated(int), default=[0])
    p.add_argument("--replicas", type=comma_separated(int, least=1, example="1,2,3"), default=[1])
    return p


def test_numbers_of_each_kind_in_order() -> None:
    args = parser().parse_args(["--rates", "1000,2500.5", "--sizes", "10000,0,300"])
    assert args.rates == [1000.0, 2500.5]
    assert args.sizes == [10000, 0, 300]
    assert all(type(n) is int for n in args.sizes)


def test_empty_items_skipped_and_empty_text_the_empty_list() -> None:
    assert parser().parse_args(["--sizes", "1,,2,"]).sizes == [1, 2]
    assert parser().parse_args(["--sizes", ""]).sizes == []


def test_values_at_the_least_are_taken() -> None:
    assert parser().parse_args(["--replicas", "1,3"]).replicas == [1, 3]
    assert parser().parse_args(["--replicas", ""]).replicas == []  # none: replicas.py skips the phase


def test_defaults_are_left_as_given() -> None:
    args = parser().parse_args([])
    assert args.rates == [1000.0] and args.sizes == [0]


@pytest.mark.parametrize(("argv", "named"), [
    (["--rates", "1000,ten"], "argument --rates: '1000,ten': give comma-separated float values"),
    (["--sizes", "1.5"], "argument --sizes: '1.5': give comma-separated int values"),
    (["--replicas", "2,0"], "argument --replicas: '2,0': give comma-separated int values of at least 1, e.g. 1,2,3"),
    (["--replicas", "-1"], "argument --replicas: '-1': give comma-separated int values of at least 1"),
])
def test_a_bad_value_is_refused_naming_its_option(argv: list[str], named: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert named in err
    assert "Traceback" not in err


def test_a_setting_splits_at_its_first_equals_sign_and_one_without_is_refused() -> None:
    assert key_value("spark.a=b=c") == ("spark.a", "b=c")
    assert key_value("spark.a=") == ("spark.a", "")
    for bad in ("spark.a", "=b"):
        with pytest.raises(argparse.ArgumentTypeError, match="give KEY=VALUE"):
            key_value(bad)
