"""io.glasspipe.spark.JsonValues (the job's JSON parse from a Kafka value's bytes) on real local Spark:
every record comes out as Spark's own from_json gives it, corrupt-record column included."""

from __future__ import annotations

import re
from typing import Any, cast

import pytest

from glasspipe_job.jvm import json_not_an_object, parse_json_values

pytestmark = pytest.mark.integration

CORRUPT = "_gp_corrupt"
SCHEMA = (
    f"id string, n bigint, x double, ok boolean, ts timestamp, tags array<string>,"
    f" u struct<name: string, age: int>, {CORRUPT} string"
)

VALUES: list[bytes | None] = [
    b'{"id":"a","n":1,"x":1.5,"ok":true,"ts":"2026-11-26T07:30:00.123456+00:00","tags":["p","q"],'
    b'"u":{"name":"z","age":3}}',
    b'{"id":"b","ts":"2026-11-26T07:30:00Z","extra":{"deep":[1,2,{"k":null}]}}',
    b'  {"id" : "c" , "n" : "12"}  ',                   # a number as a string: does not fit bigint
    b'{"id":"d","n":12.5}',                             # a fraction for a bigint
    b'{"id":"e","ts":"not a time"}',
    '{"id":"f","u":{"name":"Zoë ☃ 𝄞"}}'.encode(),      # 2-, 3- and 4-byte UTF-8
    b'{"id":"g\xff\xfe","n":2}',                        # not UTF-8 inside a string
    b'\xef\xbb\xbf{"id":"h"}',                          # a UTF-8 byte-order mark
    '{"id":"i"}'.encode("utf-16-le"),                   # NUL bytes: another encoding
    '\ufeff{"id":"j"}'.encode("utf-16"),                # a UTF-16 byte-order mark
    b'{"id":"k",',                                      # cut short
    b'[{"id":"l"}]',                                    # an array, not an object
    b'"just a string"',
    b'42',
    b'null',
    b'',
    b'   ',
    None,
    b'{"id":"m"} {"id":"n"}',                           # two objects
    b'{"id":"o","id":"p"}',                             # a duplicate key
    b'{"id":"q","n":9223372036854775808}',              # overflows bigint
    b'{"id":"r","x":NaN}',
    b'{"ID":"s","N":3}',                                # other case
    b'{"id":"t","tags":"p"}',                           # a string for an array
    b'{"id":"u","u":[1]}',                              # an array for a struct
    b'{"id":"v\\u00e9\\n","n":-0}',                     # escapes
    b'{"id":"w","n":null,"x":null,"u":null,"tags":null}',  # nulls, also for a type read only by Spark
    b'{"id":"x1","x":1,"ok":false,"u":{}}',               # an integer for a double, an empty struct
    b'{"id":"x2","x":-0.0,"u":{"age":2147483647,"name":"\\ud83d\\ude00"}}',  # int's edge, an escaped pair
    b'{"id":"x3","u":{"age":2147483648}}',              # overflows int
    b'{"id":"x4","x":1e400}',                           # beyond a double
    b'{"id":"x5","x":123456789012345678901234567890}',  # an integer beyond a long, for a double
    b'{"id":"x6","x":"1.5"}',                           # a number as a string, for a double
    b'{"id":"x7","ok":"true"}',                         # a boolean as a string
    b'{"id":"x8","ok":1}',                              # a number for a boolean
    b'{"id":12}',                                       # a number for a string
    b'{"id":{"a":[1,"b"]}}',                            # an object for a string
    b'{"id":true,"n":1}',                               # a boolean for a string
    b'{"id":"x9","u":{"name":"a","name":"b"}}',         # a duplicate key in a struct
    b'{"id":"y1","n":1,"_gp_corrupt":"x"}',             # the corrupt-record column's name as a field
    b'{"id":"y2","n":-9223372036854775808,"extra":[{"a":{"b":[]}}],"more":"z"}',
    b'{"id":"y3","u":{"name":"n","age":1,"deep":{"x":[1,{"y":2}]}}}',
    b'{"id":"y4","n":1}  \n',                          # whitespace after the object
    b'{"id":"y5","n":1}x',                              # something else after it
    b'{"id":"y6","x":Infinity,"n":007}',                 # non-numeric numbers and leading zeros
    b'{"id":"y7","x":1.0E+2}',
    b'{"id":"y8","u":{"age":-2147483649}}',
    b'{"id":"y9","ts":"2026-11-26T07:30:00z","ts":null}',  # a timestamp twice, the first not one: corrupt
    b'{"id":"z1","n":-0,"u":{"age":-0},"more":[0,-0.0e-0,{}]}',
]
# Event times: the shape io.glasspipe.spark.IsoTimestamps reads itself, its edges, and what it leaves to Spark.
TIMESTAMPS = [
    # read here (the first seven)
    "2026-11-26T07:30:00.1+05:30", "2026-11-26 07:30:00.12345-08:00", "1969-12-31T23:59:59.999999Z",
    "0001-01-03T00:00:00Z", "9999-12-30T23:59:59.999999-17:59", "2024-02-29T12:00:00+00:00",
    "2026-11-26T07:30:00-00:00",
    # left to Spark
    "2026-11-26T07:30:00.1234567Z", "2026-11-26T07:30:00", "2026-11-26T07:30:00z", "2026-11-26T07:30:00+0530",
    "2026-11-26T07:30:00+05:75", "2026-11-26T07:30:00+18:30", "2023-02-29T00:00:00Z", "2026-11-26T24:00:00Z",
    "2026-11-26T07:30:60Z", "2026-11-26T07:30:00.Z", "2026-11-26T07:30Z", "+2026-11-26T07:30:00Z",
    "2026-13-01T00:00:00Z", "2026-11-26T07:30:00 Z", "2026-11-26T07:30:00+05", "2026-1-26T07:30:00Z",
    "2026-11-26T07:30:00.000000+05:30 ",
]
VALUES += [f'{{"id":"ts{i}","ts":"{t}"}}'.encode() for i, t in enumerate(TIMESTAMPS)]
VALUES += [b'{"id":"tn","ts":1764142200}', b'{"id":"tb","ts":true}', b'{"id":"to","ts":{"a":1}}',
           b'{"id":"te","ts":""}']
VALUES += [b'  {"id" : "c" , "n" : 12}  ', b'{}']


def test_every_value_parses_as_from_json_parses_it(spark: Any) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = cast(T.StructType, T._parse_datatype_string(SCHEMA))  # SCHEMA is a struct's DDL
    rows = [(i, v) for i, v in enumerate(VALUES)]
    df = spark.createDataFrame(rows, "i int, value binary").repartition(2)
    ours = parse_json_values(df, "value", "ours", schema, CORRUPT)
    both = ours.withColumn("theirs", F.from_json(F.col("value").cast("string"), schema,
                                                 {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}))
    both = both.withColumn("ours_no_object", json_not_an_object(both, "value"))
    as_map = F.from_json(F.col("value").cast("string"), "map<string,string>")
    both = both.withColumn("theirs_no_object", as_map.isNull())
    collected = both.collect()
    assert [r["i"] for r in collected if r["ours_no_object"] != r["theirs_no_object"]] == []
    assert 0 < sum(r["ours_no_object"] for r in collected) < len(VALUES)
    got = {r["i"]: (r["ours"], r["theirs"]) for r in collected}
    assert sorted(got) == list(range(len(VALUES)))
    differ = {VALUES[i]: pair for i, pair in got.items() if repr(pair[0]) != repr(pair[1])}  # NaN != NaN
    assert differ == {}
    # the inputs do reach both outcomes: parsed, corrupt, and NULL
    outcomes = {"parsed" if o is not None and o[CORRUPT] is None else "corrupt" if o is not None else "null"
                for o, _ in got.values()}
    assert outcomes == {"parsed", "corrupt", "null"}
    assert got[0][0]["u"]["age"] == 3 and got[5][0]["u"]["name"] == "Zoë ☃ 𝄞"
    # timestamps both read here and left to Spark: some parsed, some corrupt
    ts_rows = [got[VALUES.index(v)][0] for v in VALUES if v is not None and v.startswith(b'{"id":"t')]
    assert {r[CORRUPT] is None for r in ts_rows} == {True, False}


# The records the plain reader (io.glasspipe.spark.PlainJson) takes by itself: every value the plainest token for
# its field's type, one object and nothing after it; every other record is left to Spark's parse.
PLAIN = [
    b'{"id":"b","ts":"2026-11-26T07:30:00Z","extra":{"deep":[1,2,{"k":null}]}}',
    b'  {"id" : "c" , "n" : 12}  ',
    '{"id":"f","u":{"name":"Zo\u00eb \u2603 \U0001d11e"}}'.encode(),
    b'{"id":"v\\u00e9\\n","n":-0}',
    b'{"id":"w","n":null,"x":null,"u":null,"tags":null}',
    b'{"id":"x1","x":1,"ok":false,"u":{}}',
    b'{"id":"x2","x":-0.0,"u":{"age":2147483647,"name":"\\ud83d\\ude00"}}',
    b'{"id":"x4","x":1e400}',
    b'{"id":"x5","x":123456789012345678901234567890}',
    b'{"id":"y1","n":1,"_gp_corrupt":"x"}',
    b'{"id":"y2","n":-9223372036854775808,"extra":[{"a":{"b":[]}}],"more":"z"}',
    b'{"id":"y3","u":{"name":"n","age":1,"deep":{"x":[1,{"y":2}]}}}',
    b'{"id":"y4","n":1}  \n',
    b'{"id":"y7","x":1.0E+2}',
    b'{"ID":"s","N":3}',
    b'{"id":"r","x":NaN}',
    b'{}',
    b'{"id":"z1","n":-0,"u":{"age":-0},"more":[0,-0.0e-0,{}]}',
] + [f'{{"id":"ts{i}","ts":"{t}"}}'.encode() for i, t in enumerate(TIMESTAMPS[:7])]


def test_the_plain_reader_takes_plain_records_and_leaves_every_other_to_spark(spark: Any) -> None:
    from pyspark.sql import types as T

    schema = T._parse_datatype_string(SCHEMA)
    reader = spark.sparkContext._jvm.io.glasspipe.spark.JsonValues.plainReader(schema.json(), CORRUPT)
    taken = {v for v in VALUES if v is not None and reader.read(bytearray(v)) is not None}
    assert taken ^ set(PLAIN) == set()
    # and what it takes is from_json's: test_every_value_parses_as_from_json_parses_it compares every one
    assert set(PLAIN) <= set(VALUES)


def test_generated_code_and_interpreted_eval_agree(spark: Any) -> None:
    from pyspark.sql import types as T

    schema = T._parse_datatype_string(SCHEMA)
    df = spark.createDataFrame([(i, v) for i, v in enumerate(VALUES)], "i int, value binary")
    codegen = sorted(parse_json_values(df, "value", "p", schema, CORRUPT).collect())
    spark.conf.set("spark.sql.codegen.wholeStage", "false")
    spark.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN")
    try:
        interpreted = sorted(parse_json_values(df, "value", "p", schema, CORRUPT).collect())
    finally:
        spark.conf.unset("spark.sql.codegen.wholeStage")
        spark.conf.unset("spark.sql.codegen.factoryMode")
    assert repr(codegen) == repr(interpreted)


def test_parse_and_check_runs_in_whole_stage_code_generation(spark: Any) -> None:
    """Spark's from_json has no generated code: a projection holding it ran interpreted, its code generated
    again in every task. The job's parse and checks now compile into whole-stage stages."""
    from glasspipe.api import models
    from glasspipe_job.transform import parse_and_check

    source = models.Source.model_validate({
        "name": "s", "kafka": {"topic": "t", "bootstrapServers": "k:9092"},
        "schema": {"fields": [{"name": "id", "type": "string"}, {"name": "ts", "type": "timestamp"}]},
        "eventTime": {"source": "field", "field": "ts"},
    })
    raw = spark.createDataFrame(
        [(b"k", b'{"id":"a","ts":"2026-11-26T07:30:00Z"}', "t", 0, 1, None), (b"k", b"[1]", "t", 0, 2, None)],
        "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp")
    checked = parse_and_check(raw, source)
    plan = str(checked._jdf.queryExecution().executedPlan().toString())
    # a projection in a whole-stage stage prints as "*(n) Project [...]"; one evaluated on its own, "Project ["
    interpreted = [line for line in plan.splitlines() if re.match(r"^[\s:+-]*Project \[", line)]
    assert interpreted == [], plan
    rows = {r["_gp_offset"]: r for r in checked.collect()}
    assert rows[1]["_gp_status"] == "ok" and rows[2]["_gp_reason"] == "malformed_json: not a JSON object"


def test_deduplication_per_kafka_partition_is_one_stage_of_generated_code(spark: Any, tmp_path: Any) -> None:
    """From the Kafka record to the deduplicated rows, one stage of generated code: no row counts (``observe``)
    nor watermark in between, operators without generated code that each ended a stage, with every row written
    and read again."""
    from glasspipe.api import models
    from glasspipe_job.transform import parse_and_check, source_rows, with_warmup_flag

    source = models.Source.model_validate({
        "name": "s", "kafka": {"topic": "t", "bootstrapServers": "k:9092"},
        "schema": {"fields": [{"name": "id", "type": "string"}, {"name": "ts", "type": "timestamp"}]},
        "eventTime": {"source": "field", "field": "ts"}, "filter": "id != 'x'",
        "deduplication": {"keys": ["id"], "window": "5m", "perKafkaPartition": True},
    })
    raw = spark.createDataFrame(
        [(b"k", b'{"id":"a","ts":"2026-11-26T07:30:00Z"}', "t", 0, 1, None)],
        "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp")
    rows = source_rows(with_warmup_flag(parse_and_check(raw, source), {"t": {0: 1}}), source,
                       state_root=str(tmp_path))
    plan = str(rows._jdf.queryExecution().executedPlan().toString())
    assert "CollectMetrics" not in plan and "EventTimeWatermark" not in plan, plan
    assert set(re.findall(r"\*\((\d+)\)", plan)) == {"1"}, plan


def test_the_timestamp_shape_read_here_gives_sparks_values_and_leaves_the_rest_to_spark(spark: Any) -> None:
    """IsoTimestamps reads the first seven TIMESTAMPS itself (the values Spark computes) and no other."""
    from pyspark.sql import functions as F

    jvm = spark.sparkContext._jvm
    ours = [jvm.io.glasspipe.spark.IsoTimestamps.micros(jvm.org.apache.spark.unsafe.types.UTF8String.fromString(t))
            for t in TIMESTAMPS]
    not_read = jvm.io.glasspipe.spark.IsoTimestamps.NOT_THIS_SHAPE
    df = spark.createDataFrame([(t,) for t in TIMESTAMPS[:7]], "t string")
    theirs = [r[0] for r in df.select(F.unix_micros(F.col("t").cast("timestamp"))).collect()]
    assert ours[:7] == theirs
    assert ours[7:] == [not_read] * (len(TIMESTAMPS) - 7)


def test_timestamps_at_random_get_sparks_values_and_invalid_dates_are_left_to_spark(spark: Any) -> None:
    """IsoTimestamps counts days itself: dates of every year (leap days, month ends, days a month lacks), times and
    offsets at random. Each valid one gets the value Spark's cast gives; each one java.time rejects (a day the month
    lacks, an offset past 18 hours) is left to Spark."""
    import calendar
    import random

    from pyspark.sql import functions as F

    rnd = random.Random(15)
    texts, valid = [], []
    for _ in range(2000):
        year = rnd.choice([rnd.randint(0, 9999), rnd.choice([1600, 1900, 1969, 1970, 2000, 2023, 2024, 2100])])
        month, day = rnd.randint(1, 12), rnd.choice([rnd.randint(1, 28), 29, 30, 31])
        oh, om = rnd.choice([rnd.randint(0, 17), 18, 19]), rnd.choice([0, 30, 45, rnd.randint(0, 59)])
        zone = rnd.choice(["Z", f"+{oh:02d}:{om:02d}", f"-{oh:02d}:{om:02d}"])
        fraction = rnd.choice(["", "." + "".join(rnd.choice("0123456789") for _ in range(rnd.randint(1, 6)))])
        texts.append(f"{year:04d}-{month:02d}-{day:02d}{rnd.choice('T ')}{rnd.randint(0, 23):02d}:"
                     f"{rnd.randint(0, 59):02d}:{rnd.randint(0, 59):02d}{fraction}{zone}")
        valid.append(day <= calendar.monthrange(year or 2000, month)[1] and (zone == "Z" or oh * 60 + om <= 18 * 60))
    jvm = spark.sparkContext._jvm
    ours = [jvm.io.glasspipe.spark.IsoTimestamps.micros(jvm.org.apache.spark.unsafe.types.UTF8String.fromString(t))
            for t in texts]
    good = [t for t, ok in zip(texts, valid, strict=True) if ok]
    df = spark.createDataFrame([(t,) for t in good], "t string")
    theirs = [r[0] for r in df.select(F.unix_micros(F.col("t").cast("timestamp"))).collect()]
    assert 500 < len(good) < 1800  # both kinds are there
    assert [m for m, ok in zip(ours, valid, strict=True) if ok] == theirs
    not_read = jvm.io.glasspipe.spark.IsoTimestamps.NOT_THIS_SHAPE
    assert [t for t, m, ok in zip(texts, ours, valid, strict=True) if not ok and m != not_read] == []


def test_a_task_whose_timestamps_mostly_have_another_shape_still_parses_each_as_from_json(spark: Any) -> None:
    """Past 64 timestamps IsoTimestamps cannot read, a task reads them as Spark does from the start; records of
    both shapes, and corrupt ones, in one partition, before and after that point."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = cast(T.StructType, T._parse_datatype_string(SCHEMA))  # SCHEMA is a struct's DDL
    values = []
    for i in range(300):
        ts = f"2026-11-26T07:{i // 60:02d}:{i % 60:02d}" + ("+01:00" if i % 7 == 0 else "")  # mostly no offset
        values.append(f'{{"id":"{i}","n":{i},"ts":"{ts}"}}'.encode() if i % 50 else b'{"id":"x","n":"NaN?"}')
    df = spark.createDataFrame(list(enumerate(values)), "i int, value binary").coalesce(1)
    ours = parse_json_values(df, "value", "ours", schema, CORRUPT)
    both = ours.withColumn("theirs", F.from_json(F.col("value").cast("string"), schema,
                                                 {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}))
    got = both.collect()
    assert len(got) == 300
    assert [r["i"] for r in got if repr(r["ours"]) != repr(r["theirs"])] == []
    assert sum(r["ours"][CORRUPT] is not None for r in got) == 6


def _random_documents(rnd: Any, count: int) -> tuple[list[bytes], list[bytes]]:
    """(documents, the plain printable-ASCII ones among them): records of SCHEMA's fields with values of every kind
    (plain, escaped, past ASCII, numbers of every shape, fields not declared nested deep, odd spacing, a field twice,
    cut short), so that the bytes' own reader meets each thing it defers as well as what it reads."""
    import json

    space = ["", " ", "\n", "\t", " \r\n "]

    def ws() -> str:
        return rnd.choice(space) if rnd.random() < 0.3 else ""

    def text(plain: bool) -> str:
        chars = "abcXYZ09 _-:./@~"
        s = "".join(rnd.choice(chars) for _ in range(rnd.randint(0, 24)))
        if not plain:  # anywhere in the string, so that the reader meets it at every offset, not only last
            at = rnd.randint(0, len(s))
            s = s[:at] + rnd.choice(["é", "☃", "\\n", "\\\"", "\\u0041", "\x7f", "𝄞", "\x01", "\t"]) + s[at:]
        return '"' + s + '"'

    def number(plain: bool) -> str:
        if plain:  # valid JSON, of every shape
            return rnd.choice([str(rnd.randint(-10**20, 10**20)), "-0", "0", "1.5", "-2e-7", "1E+300", "0.0"])
        return rnd.choice([str(rnd.randint(-10**rnd.randint(1, 20), 10**rnd.randint(1, 20))), "-0", "0", "007",
                           f"{rnd.uniform(-1e6, 1e6)}", "1e5", "1E-3", "-1.5e+10", "2147483647", "2147483648",
                           "-2147483648", "-2147483649", "999999999999999999", "1000000000000000000",
                           "9223372036854775807", "-9223372036854775808", "1.", "-", "01.5", "NaN"])

    def junk(depth: int, plain: bool) -> str:
        k = rnd.randint(0, 6 if depth < 4 else 3)
        if k == 0:
            return text(plain or rnd.random() < 0.9)
        if k == 1:
            return number(plain)
        if k == 2:
            return rnd.choice(["true", "false", "null"])
        if k == 3:
            return "[" + ",".join(ws() + junk(depth + 1, plain) + ws() for _ in range(rnd.randint(0, 3))) + "]"
        return "{" + ",".join(f"{ws()}{text(True)}{ws()}:{ws()}{junk(depth + 1, plain)}"
                              for _ in range(rnd.randint(0, 3))) + "}"

    def timestamp() -> str:
        return json.dumps(rnd.choice([*TIMESTAMPS, "2026-11-28T08:00:00.123Z", "2026-11-28 08:00:00+01:00"]))

    docs: list[bytes] = []
    plain: list[bytes] = []
    for _ in range(count):
        is_plain = rnd.random() < 0.5
        def value(name: str, plain: bool) -> str:
            if name == "id":
                return text(plain) if rnd.random() < 0.9 else rnd.choice(["null"] if plain else ["null", "12", "true"])
            if name == "n":
                return rnd.choice([str(rnd.randint(-10**17, 10**17)), "null"]) if plain else number(False)
            if name == "ok":
                return rnd.choice(["true", "false", "null"] + ([] if plain else ['"true"', "1", "tru"]))
            if name == "ts":
                return '"2026-11-28T08:00:00.5+05:30"' if plain else timestamp()
            if name == "u":
                return "{" + ",".join(
                    f'"name":{text(plain)}' if k == 0 else f'"age":{rnd.randint(-2**31, 2**31 - 1)}' if k == 1
                    else f'"deep":{junk(2, plain)}' for k in rnd.sample(range(3), rnd.randint(0, 3))) + "}"
            if name == "x":
                return rnd.choice(["null", "1.5", "2"])
            if name == "tags":
                return rnd.choice(["null", '["p","q"]'])
            return junk(1, plain)

        fields = ["id", "n", "ok", "ts", "u", "x", "tags", "more"]
        names = rnd.sample(fields, rnd.randint(1, len(fields)))
        if is_plain:
            names = [n for n in names if n not in ("x", "tags")]  # Spark's to read: the bytes' reader defers
        parts = [f"{ws()}\"{n}\"{ws()}:{ws()}{value(n, is_plain)}{ws()}" for n in names]
        if not is_plain and rnd.random() < 0.2:
            parts.append(f'"{names[0]}":null')  # a field twice
        doc = ws() + "{" + ",".join(parts) + "}" + ws()
        if not is_plain and rnd.random() < 0.1:
            doc = doc[: rnd.randint(0, len(doc))]  # cut short
        raw = doc.encode()
        docs.append(raw)
        if is_plain:
            plain.append(raw)
    return docs, plain


def test_the_bytes_own_reader_gives_jacksons_rows_and_defers_the_rest(spark: Any) -> None:
    """io.glasspipe.spark.AsciiJson reads plain printable-ASCII records from their bytes: each row it reads is the
    row PlainJson's Jackson parser reads, it reads every plain ASCII record, and everything else it defers; the job's
    parse of all of them is still from_json's."""
    import random

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = cast(T.StructType, T._parse_datatype_string(SCHEMA))  # SCHEMA is a struct's DDL
    reader = spark.sparkContext._jvm.io.glasspipe.spark.JsonValues.plainReader(schema.json(), CORRUPT)
    docs, plain = _random_documents(random.Random(28), 1500)
    read, differ = 0, []
    for d in docs:
        ours = reader.readAscii(bytearray(d))
        if ours is None:
            continue
        read += 1
        jackson = reader.readWithJackson(bytearray(d))
        if jackson is None or ours.toString() != jackson.toString():
            differ.append(d)
    assert differ == []
    assert [d for d in plain if reader.readAscii(bytearray(d)) is None] == []
    assert len(plain) <= read < len(docs) - 200  # it reads the plain ones and defers many others
    df = spark.createDataFrame([(i, d) for i, d in enumerate(docs)], "i int, value binary").repartition(2)
    both = parse_json_values(df, "value", "ours", schema, CORRUPT).withColumn(
        "theirs", F.from_json(F.col("value").cast("string"), schema,
                              {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}))
    rows_differ = [(docs[r["i"]], r["ours"], r["theirs"]) for r in both.collect()
                   if repr(r["ours"]) != repr(r["theirs"])]
    assert rows_differ == []
