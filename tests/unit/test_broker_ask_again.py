"""The test harness asks a busy test broker again instead of failing a test on one refused connection
(glasspipe_dev.pipelines.again_until), and still fails when the broker stays away."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from glasspipe_dev.pipelines import again_until


def test_an_answer_after_two_transport_failures_is_returned() -> None:
    failures = [2]

    def ask() -> str:
        if failures[0]:
            failures[0] -= 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return "answer"

    assert again_until(5, ask) == "answer" and failures == [0]


def test_a_broker_that_stays_away_fails_with_its_last_error() -> None:
    asked = [0]

    def ask() -> str:
        asked[0] += 1
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    with pytest.raises(KafkaException) as e:
        again_until(0.5, ask)
    assert e.value.args[0].code() == KafkaError._TRANSPORT and 2 <= asked[0] <= 5


def test_another_error_is_not_asked_again() -> None:
    asked = [0]

    def ask() -> str:
        asked[0] += 1
        raise KeyError("no such topic")

    with pytest.raises(KeyError):
        again_until(5, ask)
    assert asked == [1]
