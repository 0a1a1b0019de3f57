"""Deep validation: what the CRD cannot check, with messages that name the field and the fix."""

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from glasspipe.api.validation import SpecInvalid, table_sort_key, validate_resource
from glasspipe.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
pytestmark = pytest.mark.unit


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def problems_of(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecInvalid) as e:
        validate_resource(doc)
    return [str(p) for p in e.value.problems]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    _, columns = validate_resource(yaml.safe_load(path.read_text()))
    assert columns, "every example writes columns"


def test_bad_filter_expression_is_rejected() -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sources"][0]["filter"] = "status = = 'x'"
    [msg] = problems_of(doc)
    assert msg.startswith("spec.sources[0].filter: is not a valid Spark SQL expression")


def test_filter_on_unknown_field_is_rejected() -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sources"][0]["filter"] = "stat = 'delivered'"
    [msg] = problems_of(doc)
    assert "spec.sources[0].filter: refers to 'stat'" in msg and "declare it in schema.fields" in msg


def test_non_boolean_filter_is_rejected() -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sources"][0]["filter"] = "'delivered'"
    [msg] = problems_of(doc)
    assert "must be a boolean condition" in msg


def test_unknown_dedup_key_is_rejected() -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sources"][0]["deduplication"]["keys"] = ["smsid"]
    [msg] = problems_of(doc)
    assert msg.startswith("spec.sources[0].deduplication.keys[0]: 'smsid' is not a declared field")
    assert "sms_id" in msg  # says what would be valid


def test_impossible_type_mapping_is_rejected() -> None:
    doc = load("orders-users-join.yaml")
    doc["spec"]["sink"]["clickhouse"]["columns"][3]["type"] = "Float64"  # created_at is a timestamp
    [msg] = problems_of(doc)
    assert msg.startswith("spec.sink.clickhouse.columns[3].type: cannot write field orders.created_at of type "
                          "timestamp into ClickHouse Float64")
    assert "DateTime" in msg


def test_nullable_field_into_non_nullable_column_is_rejected() -> None:
    doc = load("orders-users-join.yaml")
    doc["spec"]["sink"]["clickhouse"]["columns"][4]["type"] = "String"
    [msg] = problems_of(doc)
    assert "String cannot hold NULL" in msg and "Nullable(String)" in msg


def test_left_join_right_columns_must_be_nullable() -> None:
    doc = load("orders-users-join.yaml")
    doc["spec"]["join"]["type"] = "left"
    doc["spec"]["sources"][1]["schema"]["fields"][1]["nullable"] = False
    doc["spec"]["sink"]["clickhouse"]["columns"][4]["type"] = "String"
    [msg] = problems_of(doc)
    assert "unmatched rows of a left join have no right side" in msg


def test_ambiguous_join_column_must_be_qualified() -> None:
    doc = load("orders-users-join.yaml")
    doc["spec"]["sink"]["clickhouse"]["columns"][1].pop("from")
    [msg] = problems_of(doc)
    assert "'user_id' is a field of both sources: write orders.user_id or users.user_id" in msg


def test_default_columns_clash_in_join() -> None:
    doc = load("orders-users-join.yaml")
    del doc["spec"]["sink"]["clickhouse"]["columns"]
    doc["spec"]["sink"]["clickhouse"]["orderBy"] = ["order_id"]
    msgs = problems_of(doc)
    assert any("field 'user_id' is in sources 'orders' and 'users'" in m for m in msgs)


def test_sorting_a_created_table_by_a_nullable_column_is_rejected() -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sink"]["clickhouse"]["orderBy"] = ["sms_id", "status"]  # status: nullable by default
    [msg] = problems_of(doc)
    assert msg.startswith("spec.sink.clickhouse.orderBy[1]: 'status' is Nullable(String)")
    assert "declare its field nullable: false" in msg
    doc["spec"]["sink"]["clickhouse"]["createTable"] = False  # the table is the user's: its key is theirs
    validate_resource(doc)


def test_a_created_table_is_sorted_by_the_dedup_keys_only_when_they_can_be_a_sorting_key() -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sink"]["clickhouse"].pop("orderBy", None)
    assert table_sort_key(*validate_resource(doc)) == ["sms_id"]
    doc["spec"]["sources"][0]["schema"]["fields"][0]["nullable"] = True  # a Nullable(String) sms_id column
    assert table_sort_key(*validate_resource(doc)) is None
    doc["spec"]["sources"][0]["schema"]["fields"][0]["nullable"] = False
    doc["spec"]["sink"]["clickhouse"]["columns"] = [{"name": "status"}, {"name": "sent_at"}]  # no sms_id column
    assert table_sort_key(*validate_resource(doc)) is None
    doc["spec"]["sink"]["clickhouse"]["orderBy"] = ["sent_at"]
    assert table_sort_key(*validate_resource(doc)) == ["sent_at"]


def test_join_key_type_mismatch() -> None:
    doc = load("orders-users-join.yaml")
    doc["spec"]["sources"][1]["schema"]["fields"][0]["type"] = "long"
    [msg] = problems_of(doc)
    assert msg.startswith("spec.join.right.keys[0]: type long of 'user_id' differs from string")


def test_expression_column_needs_type_and_known_fields() -> None:
    doc = load("filter-mapping.yaml")
    cols = doc["spec"]["sink"]["clickhouse"]["columns"]
    cols[1].pop("type")
    cols[3]["expression"] = "upper(countri)"
    msgs = problems_of(doc)
    assert ("spec.sink.clickhouse.columns[1].type: a column computed by an expression needs its ClickHouse type"
            in msgs[0])
    assert "spec.sink.clickhouse.columns[3].expression: 'countri' is not a declared field" in msgs[1]


def test_window_bounds() -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sources"][0]["deduplication"]["window"] = "31d"
    [msg] = problems_of(doc)
    assert msg == "spec.sources[0].deduplication.window: must be greater than 0 and at most 30d, got 31d"
    doc["spec"]["sources"][0]["deduplication"]["window"] = "5 minutes"
    [msg] = problems_of(doc)
    assert msg == ("spec.sources[0].deduplication.window: '5 minutes' is not a duration: write a whole number "
                   "and a unit, e.g. 500ms, 30s, 5m, 1h, 7d")


@pytest.mark.parametrize("value", ["0s", "30d"])
def test_max_future_skew_bounds_hold_without_an_api_server(value: str) -> None:
    """``glasspipe run`` and the job have no CRD to apply its CEL rule: the same bound is checked here."""
    doc = load("sms-dedup.yaml")
    doc["spec"]["sources"][0]["eventTime"]["maxFutureSkew"] = value
    [msg] = problems_of(doc)
    assert msg == f"spec.sources[0].eventTime.maxFutureSkew: must be greater than 0 and at most 7d, got {value}"


@pytest.mark.parametrize("value", ["0s", "999ms", "25h", "2d"])
def test_mutation_timeout_out_of_bounds_names_the_field_and_the_fix(value: str) -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sink"]["clickhouse"]["mutationTimeout"] = value
    [msg] = problems_of(doc)
    assert msg.startswith(f"spec.sink.clickhouse.mutationTimeout: must be at least 1s and at most 24h, got {value}: ")
    assert "default 15m" in msg and "raise it" in msg


def test_mutation_timeout_defaults_to_15m_and_takes_the_bounds() -> None:
    doc = load("sms-dedup.yaml")
    spec, _ = validate_resource(doc)
    assert spec.sink.clickhouse.mutation_timeout == "15m"
    for value in ("1s", "90s", "2h", "24h"):
        doc["spec"]["sink"]["clickhouse"]["mutationTimeout"] = value
        assert validate_resource(doc)[0].sink.clickhouse.mutation_timeout == value
    doc["spec"]["sink"]["clickhouse"]["mutationTimeout"] = "15 minutes"
    [msg] = problems_of(doc)
    assert msg == ("spec.sink.clickhouse.mutationTimeout: '15 minutes' is not a duration: write a whole number "
                   "and a unit, e.g. 500ms, 30s, 5m, 1h, 7d")


def test_unknown_field_and_inline_password_are_rejected() -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sink"]["clickhouse"]["password"] = "hunter2"
    [msg] = problems_of(doc)
    assert msg.startswith("spec.sink.clickhouse.password: unknown field")


def test_event_time_format_must_fit_field_type() -> None:
    doc = load("filter-mapping.yaml")
    doc["spec"]["sources"][0]["eventTime"]["format"] = "iso8601"
    [msg] = problems_of(doc)
    assert msg.startswith("spec.sources[0].eventTime.format: field 'paid_at' of type long")


def test_resolved_columns_qualify_join_fields() -> None:
    _, columns = validate_resource(load("orders-users-join.yaml"))
    by_name = {c.name: c for c in columns}
    assert by_name["user_id"].sql == "`orders`.`user_id`"
    assert by_name["country"].sql == "`users`.`country`"


def test_cli_validate_reports_every_problem(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = copy.deepcopy(load("sms-dedup.yaml"))
    doc["spec"]["sources"][0]["filter"] = "status ==="
    doc["spec"]["sources"][0]["deduplication"]["keys"] = ["nope"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "spec.sources[0].filter: is not a valid Spark SQL expression" in err
    assert "spec.sources[0].deduplication.keys[0]: 'nope' is not a declared field" in err
    assert "Traceback" not in err
    assert main(["validate", *map(str, EXAMPLES)]) == 0


SECURE_PROBLEMS = [
    ({"protocol": "SASL_SSL"}, "spec.sources[0].kafka.security.sasl: protocol SASL_SSL needs sasl: add mechanism, "
                               "usernameSecretRef and passwordSecretRef"),
    ({"protocol": "SSL", "sasl": {"mechanism": "PLAIN", "usernameSecretRef": {"name": "u", "key": "k"},
                                  "passwordSecretRef": {"name": "u", "key": "p"}}},
     "spec.sources[0].kafka.security.sasl: is only used with protocol SASL_PLAINTEXT or SASL_SSL, not SSL"),
    ({"protocol": "SASL_PLAINTEXT", "sasl": {"mechanism": "PLAIN", "usernameSecretRef": {"name": "u", "key": "k"},
                                             "passwordSecretRef": {"name": "u", "key": "p"}},
      "tls": {"caSecretRef": {"name": "ca", "key": "ca.crt"}}},
     "spec.sources[0].kafka.security.tls: is only used with protocol SSL or SASL_SSL, not SASL_PLAINTEXT"),
    ({"protocol": "SSL", "tls": {"clientCertSecretRef": {"name": "c", "key": "tls.crt"}}},
     "spec.sources[0].kafka.security.tls: clientCertSecretRef and clientKeySecretRef go together"),
    ({"protocol": "SASL_SSL", "sasl": {"mechanism": "GSSAPI", "usernameSecretRef": {"name": "u", "key": "k"},
                                       "passwordSecretRef": {"name": "u", "key": "p"}}},
     "spec.sources[0].kafka.security.sasl.mechanism: Input should be 'PLAIN', 'SCRAM-SHA-256' or 'SCRAM-SHA-512'"),
    ({"protocol": "SASL_SSL", "sasl": {"mechanism": "PLAIN", "usernameSecretRef": {"name": "u", "key": "k"}}},
     "spec.sources[0].kafka.security.sasl.passwordSecretRef: is required"),
    ({"protocol": "SSL", "tls": {"caSecretRef": {"name": "Kafka_CA", "key": "ca.crt"}}},
     "spec.sources[0].kafka.security.tls.caSecretRef.name: 'Kafka_CA' does not match"),
    # a password written into the spec has nowhere to go: there is no such field
    ({"protocol": "SASL_SSL", "sasl": {"mechanism": "PLAIN", "username": "u", "password": "hunter2"}},
     "spec.sources[0].kafka.security.sasl.password: unknown field"),
]


@pytest.mark.parametrize(("security", "expected"), SECURE_PROBLEMS, ids=[e[1].split(":")[0].rsplit(".", 1)[-1] + str(i)
                                                                        for i, e in enumerate(SECURE_PROBLEMS)])
def test_kafka_security_mistakes_name_the_field_and_the_fix(security: dict[str, Any], expected: str) -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sources"][0]["kafka"]["security"] = security
    msgs = problems_of(doc)
    assert any(m.startswith(expected) for m in msgs), msgs


def test_clickhouse_ca_without_secure_is_rejected() -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sink"]["clickhouse"]["caSecretRef"] = {"name": "ch-ca", "key": "ca.crt"}
    [msg] = problems_of(doc)
    assert msg == "spec.sink.clickhouse.caSecretRef: is only used with secure: true: set secure or remove caSecretRef"


def test_every_security_setting_is_accepted() -> None:
    doc = load("secure-sms-dedup.yaml")
    doc["spec"]["sources"][0]["kafka"]["security"]["tls"].update(
        clientCertSecretRef={"name": "client", "key": "tls.crt"},
        clientKeySecretRef={"name": "client", "key": "tls.key"})
    spec, _ = validate_resource(doc)
    tls = spec.sources[0].kafka.security.tls
    assert tls is not None and tls.client_key_secret_ref is not None and tls.client_key_secret_ref.key == "tls.key"
    full = doc["spec"]["sources"][0]["kafka"]["security"]
    for protocol in ("SASL_PLAINTEXT", "SSL", "PLAINTEXT"):
        sec = {**copy.deepcopy(full), "protocol": protocol}
        if not protocol.startswith("SASL"):
            sec.pop("sasl")
        if not protocol.endswith("SSL"):
            sec.pop("tls")
        doc["spec"]["sources"][0]["kafka"]["security"] = sec
        assert validate_resource(doc)[0].sources[0].kafka.security.protocol == protocol


def test_per_kafka_partition_deduplication_is_not_for_a_join() -> None:
    """A join's side deduplicates by key across its topic's partitions (its key need not be the topic's)."""
    doc = load("orders-users-join.yaml")
    doc["spec"]["sources"][0]["deduplication"] = {"keys": ["order_id"], "window": "5m", "perKafkaPartition": True}
    [msg] = problems_of(doc)
    assert msg.startswith("spec.sources[0].deduplication.perKafkaPartition: is not for a joined source")
    assert "remove it or the join" in msg


def test_own_state_deduplication_is_valid_on_a_join_side() -> None:
    doc = load("dedup-then-join.yaml")
    doc["spec"]["sources"][1]["deduplication"]["ownState"] = True
    spec, _ = validate_resource(doc)
    assert [s.deduplication is not None and s.deduplication.own_state for s in spec.sources] == [False, True]


def test_own_state_deduplication_is_valid_alone() -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sources"][0]["deduplication"]["ownState"] = True
    spec, _ = validate_resource(doc)
    assert spec.sources[0].deduplication is not None and spec.sources[0].deduplication.own_state


def test_per_kafka_partition_deduplication_is_valid_alone() -> None:
    doc = load("sms-dedup.yaml")
    doc["spec"]["sources"][0]["deduplication"]["perKafkaPartition"] = True
    spec, _ = validate_resource(doc)
    assert spec.sources[0].deduplication is not None and spec.sources[0].deduplication.per_kafka_partition
