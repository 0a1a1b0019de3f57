"""How a micro-batch is cut into the parts the driver takes one at a time (arrow_parts.partitions_per_part), and
the batch size it is decided from (handover.records_between)."""

import pytest

from glasspipe_job.arrow_parts import partitions_per_part
from glasspipe_job.handover import records_between

pytestmark = pytest.mark.unit


def test_a_batch_of_unknown_size_goes_one_spark_partition_at_a_time() -> None:
    assert partitions_per_part(None, 8_192, 4) == 1


def test_a_batch_the_driver_may_hold_whole_is_one_part() -> None:
    assert partitions_per_part(1_500, 8_192, 4) == 4
    assert partitions_per_part(8_192, 8_192, 4) == 4


def test_a_larger_batch_takes_as_many_partitions_as_keep_a_part_within_the_bound() -> None:
    assert partitions_per_part(16_384, 8_192, 4) == 2  # 4,096 rows expected per partition
    assert partitions_per_part(20_000, 8_192, 4) == 1
    assert partitions_per_part(65_536, 8_192, 4) == 1  # a full batch of the memory test: as before


def test_a_single_partition_is_one_part_whatever_the_size() -> None:
    assert partitions_per_part(10**9, 1, 1) == 1


def test_records_between_two_offset_logs() -> None:
    start = {"t": {0: 10, 1: 0}}
    assert records_between(start, {"t": {0: 15, 1: 3}}) == 8
    assert records_between(start, start) == 0


def test_a_partition_without_a_start_makes_the_size_unknown() -> None:
    assert records_between({"t": {0: 10}}, {"t": {0: 15, 1: 3}}) is None
