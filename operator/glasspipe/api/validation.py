"""Deep validation of a GlassPipeline spec: what the API server's schema and CEL rules cannot check.

Used by the operator (a spec that fails here is reported as Degraded and never rendered) and by
``glasspipe validate``. Every problem names the field path as written in YAML and how to fix it.
No JVM needed: Spark SQL expressions are parsed with sqlglot's Spark dialect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast

import sqlglot
from pydantic import ValidationError
from sqlglot import exp

from glasspipe.api import models
from glasspipe.api.durations import DURATION_PATTERN, parse_duration_ms


@dataclass(frozen=True)
class Problem:
    """One reason a spec cannot run: where (YAML path) and what to do."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecInvalid(Exception):
    """The spec cannot be run; ``problems`` says where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class OutputColumn:
    """A resolved sink column: a Spark SQL expression over the pipeline's row and its ClickHouse type."""

    name: str
    sql: str
    clickhouse_type: str
    source_field: str | None  # "source.field" when the column copies a field


# ------------------------------------------------------------------------------------------ types

DEFAULT_CLICKHOUSE_TYPE = {
    "string": "String", "int": "Int32", "long": "Int64", "float": "Float32", "double": "Float64",
    "boolean": "UInt8", "timestamp": "DateTime", "date": "Date",
}
_INTS = {f"{u}Int{n}" for u in ("", "U") for n in (8, 16, 32, 64)}
_NUMERIC = _INTS | {"Float32", "Float64", "Decimal"}
# Which ClickHouse base types a source type converts to without losing its meaning.
_CONVERTIBLE: dict[str, set[str]] = {
    "string": {"String", "FixedString", "UUID"},
    "int": _NUMERIC | {"String"},
    "long": _NUMERIC | {"String"},
    "float": {"Float32", "Float64", "Decimal", "String"},
    "double": {"Float32", "Float64", "Decimal", "String"},
    "decimal": {"Decimal", "Float32", "Float64", "String"},
    "boolean": {"UInt8", "Int8", "Bool", "String"},
    "timestamp": {"DateTime", "DateTime64", "Date", "String"},
    "date": {"Date", "DateTime", "DateTime64", "String"},
}


@dataclass(frozen=True)
class ClickHouseType:
    """A ClickHouse type string taken apart: the one parser for spec types and the types a table reports."""

    base: str  # name without parameters or wrappers: "DateTime64"
    inner: str  # without the LowCardinality/Nullable wrappers: "DateTime64(3)"
    nullable: bool  # Nullable(...) at the top (or inside LowCardinality), not deeper as in Array(Nullable(...))
    low_cardinality: bool


def parse_clickhouse_type(ch_type: str) -> ClickHouseType:
    t = ch_type.strip()
    low = nullable = False
    if t.startswith("LowCardinality(") and t.endswith(")"):
        low, t = True, t[len("LowCardinality("):-1].strip()
    if t.startswith("Nullable(") and t.endswith(")"):
        nullable, t = True, t[len("Nullable("):-1].strip()
    return ClickHouseType(t.split("(")[0].strip(), t, nullable, low)


def split_clickhouse_type(ch_type: str) -> tuple[str, bool]:
    """(base type name without parameters or wrappers, nullable?) of a ClickHouse type."""
    parsed = parse_clickhouse_type(ch_type)
    return parsed.base, parsed.nullable


def nullable_type(ch_type: str) -> str:
    """The Nullable form of a ClickHouse type (inside LowCardinality, where ClickHouse wants it)."""
    if ch_type.startswith("Nullable(") or "(Nullable(" in ch_type:
        return ch_type
    if ch_type.startswith("LowCardinality("):
        return f"LowCardinality(Nullable({ch_type[len('LowCardinality('):-1]}))"
    return f"Nullable({ch_type})"


def field_base_type(field_type: str) -> str:
    return "decimal" if field_type.startswith("decimal") else field_type


def default_clickhouse_type(field: models.SchemaField) -> str:
    base = field_base_type(field.type)
    ch = f"Decimal{field.type[len('decimal'):]}" if base == "decimal" else DEFAULT_CLICKHOUSE_TYPE[base]
    return f"Nullable({ch})" if field.nullable else ch


# -------------------------------------------------------------------------------- SQL expressions


def _parse_sql(text: str, path: str, problems: list[Problem]) -> exp.Expression | None:
    try:
        parsed = sqlglot.parse_one(text, read="spark")
    except sqlglot.errors.ParseError as e:
        first = e.errors[0]["description"] if e.errors else str(e)
        problems.append(Problem(path, f"is not a valid Spark SQL expression ({first}): {text!r}"))
        return None
    if isinstance(parsed, exp.Select | exp.Query):
        problems.append(Problem(path, f"must be an expression, not a query: {text!r}"))
        return None
    return cast(exp.Expression, parsed)


def referenced_columns(expression: exp.Expression) -> list[tuple[str | None, str]]:
    """(qualifier, name) of every column an expression reads."""
    return [(c.table or None, c.name) for c in expression.find_all(exp.Column)]


_BOOLEAN_NODES = (exp.Predicate, exp.Connector, exp.Not, exp.Boolean, exp.In, exp.Between, exp.Is, exp.Like, exp.ILike,
                  exp.RegexpLike, exp.Exists)


def _looks_boolean(expression: exp.Expression, fields: dict[str, models.SchemaField]) -> bool:
    node = expression.unnest()
    if isinstance(node, _BOOLEAN_NODES):
        return True
    if isinstance(node, exp.Column):
        f = fields.get(node.name)
        return f is not None and f.type == "boolean"
    if isinstance(node, exp.Literal | exp.Null):
        return False
    if isinstance(node, exp.Binary | exp.Cast | exp.TryCast):
        return isinstance(node, exp.Cast | exp.TryCast) and node.to.this == exp.DataType.Type.BOOLEAN
    return True  # a function call: Spark checks its type at start-up


# ------------------------------------------------------------------------------------ the checks


class _Checker:
    def __init__(self, spec: models.GlassPipelineSpec) -> None:
        self.spec = spec
        self.problems: list[Problem] = []

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def run(self) -> list[OutputColumn]:
        for i, source in enumerate(self.spec.sources):
            self.check_source(f"spec.sources[{i}]", source)
            self.check_kafka_security(f"spec.sources[{i}].kafka.security", source.kafka.security)
        self.check_clickhouse_tls()
        self.check_mutation_timeout()
        if self.spec.join is not None:
            self.check_join()
        elif len(self.spec.sources) != 1:
            self.add("spec.join", "two sources need a join (add spec.join) or remove one source")
        columns = self.resolve_columns()
        self.check_order_by(columns)
        return columns

    def check_source(self, path: str, source: models.Source) -> None:
        fields = {f.name: f for f in source.schema_.fields}
        if len(fields) != len(source.schema_.fields):
            self.add(f"{path}.schema.fields", "field names must be unique")
        if source.filter is not None:
            parsed = _parse_sql(source.filter, f"{path}.filter", self.problems)
            if parsed is not None:
                for qualifier, name in referenced_columns(parsed):
                    if name not in fields or qualifier not in (None, source.name):
                        self.add(f"{path}.filter", f"refers to {name!r}, which is not a field of source "
                                 f"{source.name!r}; declare it in schema.fields or fix the name "
                                 f"(fields: {', '.join(fields)})")
                if not _looks_boolean(parsed, fields):
                    self.add(f"{path}.filter", f"must be a boolean condition (records are kept where it is true), "
                             f"got {source.filter!r}")
        if source.deduplication is not None:
            dd = source.deduplication
            for j, key in enumerate(dd.keys):
                if key not in fields:
                    self.add(f"{path}.deduplication.keys[{j}]", f"{key!r} is not a declared field; "
                             f"declare it in schema.fields or use one of: {', '.join(fields)}")
            self.check_window(f"{path}.deduplication.window", dd.window, models.MAX_DEDUP_WINDOW)
        et = source.event_time
        if et.source == "field":
            f = fields.get(et.field or "")
            if f is None:
                self.add(f"{path}.eventTime.field", f"{et.field!r} is not a declared field of source {source.name!r}")
            else:
                ok = {"timestamp": {"iso8601"}, "string": {"iso8601"}, "long": {"epochMillis", "epochSeconds"},
                      "int": {"epochSeconds"}, "date": {"iso8601"}}.get(f.type, set())
                if et.format not in ok:
                    self.add(f"{path}.eventTime.format", f"field {f.name!r} of type {f.type} cannot hold an event "
                             f"time in format {et.format}; use " + (" or ".join(sorted(ok)) if ok else
                                                                   "a timestamp, string or long field"))
        self.check_window(f"{path}.eventTime.allowedLateness", et.allowed_lateness, "7d")
        self.check_window(f"{path}.eventTime.maxFutureSkew", et.max_future_skew, "7d")

    def check_kafka_security(self, path: str, sec: models.KafkaSecurity) -> None:
        """The CRD's CEL rules on security, for ``glasspipe validate`` and the job (no API server there)."""
        sasl_protocol = sec.protocol in models.SASL_PROTOCOLS
        if sasl_protocol and sec.sasl is None:
            self.add(f"{path}.sasl", f"protocol {sec.protocol} needs sasl: add mechanism, usernameSecretRef and "
                     "passwordSecretRef (Secret keys with the SASL user name and password)")
        if not sasl_protocol and sec.sasl is not None:
            self.add(f"{path}.sasl", f"is only used with protocol SASL_PLAINTEXT or SASL_SSL, not {sec.protocol}: "
                     "set the protocol or remove sasl")
        if sec.tls is not None:
            if sec.protocol not in models.TLS_PROTOCOLS:
                self.add(f"{path}.tls", f"is only used with protocol SSL or SASL_SSL, not {sec.protocol}: "
                         "set the protocol or remove tls")
            if (sec.tls.client_cert_secret_ref is None) != (sec.tls.client_key_secret_ref is None):
                self.add(f"{path}.tls", "clientCertSecretRef and clientKeySecretRef go together (mutual TLS): "
                         "give both or neither")

    def check_clickhouse_tls(self) -> None:
        sink = self.spec.sink.clickhouse
        if sink.ca_secret_ref is not None and not sink.secure:
            self.add("spec.sink.clickhouse.caSecretRef", "is only used with secure: true: set secure or remove "
                     "caSecretRef")

    def check_mutation_timeout(self) -> None:
        path, value = "spec.sink.clickhouse.mutationTimeout", self.spec.sink.clickhouse.mutation_timeout
        try:
            ms = parse_duration_ms(value)
        except ValueError as e:
            self.add(path, str(e))
            return
        low, high = models.MIN_MUTATION_TIMEOUT, models.MAX_MUTATION_TIMEOUT
        if not parse_duration_ms(low) <= ms <= parse_duration_ms(high):
            self.add(path, f"must be at least {low} and at most {high}, got {value}: it is how long the sink waits "
                     f"for a DELETE on the table before the replica stops (default {models.DEFAULT_MUTATION_TIMEOUT}; "
                     "raise it when deletes on big parts are only slow)")

    def check_window(self, path: str, value: str, maximum: str) -> None:
        try:
            ms = parse_duration_ms(value)
        except ValueError as e:
            self.add(path, str(e))
            return
        if ms <= 0 or ms > parse_duration_ms(maximum):
            self.add(path, f"must be greater than 0 and at most {maximum}, got {value}")

    def check_join(self) -> None:
        join = self.spec.join
        assert join is not None
        names = [s.name for s in self.spec.sources]
        sides = {}
        for side_name, side in (("left", join.left), ("right", join.right)):
            if side.source not in names:
                self.add(f"spec.join.{side_name}.source", f"{side.source!r} is not a source; use one of {names}")
                continue
            source = self.spec.source(side.source)
            sides[side_name] = source
            for j, key in enumerate(side.keys):
                if source.field(key) is None:
                    self.add(f"spec.join.{side_name}.keys[{j}]",
                             f"{key!r} is not a declared field of source {source.name!r}")
        if join.left.source == join.right.source:
            self.add("spec.join.right.source", "must name the other source than join.left.source")
        if len(join.left.keys) != len(join.right.keys):
            self.add("spec.join", "join.left.keys and join.right.keys must have the same length")
        elif "left" in sides and "right" in sides:
            for j, (lk, rk) in enumerate(zip(join.left.keys, join.right.keys, strict=True)):
                lf, rf = sides["left"].field(lk), sides["right"].field(rk)
                if lf and rf and lf.type != rf.type:
                    self.add(f"spec.join.right.keys[{j}]", f"type {rf.type} of {rk!r} differs from {lf.type} of "
                             f"{lk!r} on the left; declare both keys with one type")
        self.check_window("spec.join.window", join.window, models.MAX_JOIN_WINDOW)
        for i, source in enumerate(self.spec.sources):
            if source.deduplication is not None and source.deduplication.per_kafka_partition:
                self.add(f"spec.sources[{i}].deduplication.perKafkaPartition",
                         "is not for a joined source (the join's sides deduplicate by key across partitions): "
                         "remove it or the join")

    # -- columns

    def _lookup(self, qualifier: str | None, name: str, path: str) -> tuple[models.Source, models.SchemaField] | None:
        candidates = [
            (s, f) for s in self.spec.sources if qualifier in (None, s.name)
            for f in s.schema_.fields if f.name == name
        ]
        if not candidates:
            where = f"source {qualifier!r}" if qualifier else "any source"
            self.add(path, f"{name!r} is not a declared field of {where}")
            return None
        if len(candidates) > 1:
            both = " or ".join(f"{s.name}.{name}" for s, _ in candidates)
            self.add(path, f"{name!r} is a field of both sources: write {both}")
            return None
        return candidates[0]

    def _right_side_nullable(self, source: models.Source) -> bool:
        join = self.spec.join
        return join is not None and join.type == "left" and source.name == join.right.source

    def resolve_columns(self) -> list[OutputColumn]:
        sink = self.spec.sink.clickhouse
        out: list[OutputColumn] = []
        if sink.columns is None:
            seen: dict[str, str] = {}
            for source in self.spec.sources:
                for f in source.schema_.fields:
                    if f.name in seen:
                        self.add("spec.sink.clickhouse.columns", f"field {f.name!r} is in sources {seen[f.name]!r} "
                                 f"and {source.name!r}: list the output columns with their from: to say which")
                        continue
                    seen[f.name] = source.name
                    ch = default_clickhouse_type(f)
                    if self._right_side_nullable(source):
                        ch = nullable_type(ch)
                    out.append(OutputColumn(f.name, self.column_sql(source, f.name), ch, f"{source.name}.{f.name}"))
            return out
        names = [c.name for c in sink.columns]
        for i, col in enumerate(sink.columns):
            path = f"spec.sink.clickhouse.columns[{i}]"
            if names.count(col.name) > 1:
                self.add(f"{path}.name", f"column {col.name!r} is listed more than once")
            if col.expression is not None:
                if col.type is None:
                    self.add(f"{path}.type", "a column computed by an expression needs its ClickHouse type, "
                             "e.g. type: Int64")
                    continue
                parsed = _parse_sql(col.expression, f"{path}.expression", self.problems)
                if parsed is None:
                    continue
                for qualifier, name in referenced_columns(parsed):
                    self._lookup(qualifier, name, f"{path}.expression")
                out.append(OutputColumn(col.name, self.expression_sql(parsed), col.type, None))
                continue
            qualifier, _, name = (col.from_ or col.name).rpartition(".")
            found = self._lookup(qualifier or None, name, f"{path}.from" if col.from_ else f"{path}.name")
            if found is None:
                continue
            source, field = found
            nullable_input = field.nullable or self._right_side_nullable(source)
            ch_type = col.type or default_clickhouse_type(field)
            if col.type is None and self._right_side_nullable(source):
                ch_type = nullable_type(ch_type)
            base, nullable_column = split_clickhouse_type(ch_type)
            allowed = _CONVERTIBLE[field_base_type(field.type)]
            if base not in allowed:
                self.add(f"{path}.type", f"cannot write field {source.name}.{field.name} of type {field.type} into "
                         f"ClickHouse {ch_type}; use one of {', '.join(sorted(allowed))} "
                         "(or convert it with an expression)")
            elif nullable_input and not nullable_column:
                why = ("unmatched rows of a left join have no right side" if self._right_side_nullable(source)
                       else "the field is nullable")
                self.add(f"{path}.type", f"{ch_type} cannot hold NULL but {why}: use {nullable_type(ch_type)}, or "
                         f"set nullable: false on field {field.name!r} (records without it then go to the dead-letter "
                         "topic)")
            out.append(OutputColumn(col.name, self.column_sql(source, field.name), ch_type,
                                    f"{source.name}.{field.name}"))
        return out

    def column_sql(self, source: models.Source, field: str) -> str:
        """Columns are addressed as `source`.`field` in the pipeline's row once sources are joined."""
        if self.spec.join is None:
            return f"`{field}`"
        return f"`{source.name}`.`{field}`"

    def expression_sql(self, parsed: exp.Expression) -> str:
        if self.spec.join is not None:
            for column in parsed.find_all(exp.Column):
                if not column.table:
                    owner = next((s.name for s in self.spec.sources if s.field(column.name)), None)
                    if owner:
                        column.set("table", exp.to_identifier(owner))
        return parsed.sql(dialect="spark")

    def check_order_by(self, columns: list[OutputColumn]) -> None:
        sink = self.spec.sink.clickhouse
        types = {c.name: c.clickhouse_type for c in columns}
        for i, key in enumerate(sink.order_by or []):
            if key not in types:
                self.add(f"spec.sink.clickhouse.orderBy[{i}]", f"{key!r} is not an output column "
                         f"(columns: {', '.join(sorted(types))})")
            elif sink.create_table and parse_clickhouse_type(types[key]).nullable:
                self.add(f"spec.sink.clickhouse.orderBy[{i}]", f"{key!r} is {types[key]}, and ClickHouse cannot "
                         "sort a table by a Nullable column: declare its field nullable: false (a record without "
                         "it then goes to the dead-letter topic), give the column a type that is not Nullable, "
                         "or sort by other columns")


def table_sort_key(spec: models.GlassPipelineSpec, columns: list[OutputColumn]) -> list[str] | None:
    """The sorting key of a table glasspipe creates: ``sink.clickhouse.orderBy``; else the deduplication keys when
    each is an output column that is not Nullable (ClickHouse refuses a Nullable sorting key, and a key may
    not be among the columns at all); else None, and the job sorts by its first column that is not Nullable."""
    if spec.sink.clickhouse.order_by:
        return list(spec.sink.clickhouse.order_by)
    keys = next((list(s.deduplication.keys) for s in spec.sources if s.deduplication), [])
    types = {c.name: c.clickhouse_type for c in columns}
    if keys and all(k in types and not parse_clickhouse_type(types[k]).nullable for k in keys):
        return keys
    return None


def _pydantic_problems(err: ValidationError) -> list[Problem]:
    problems = []
    for e in err.errors():
        parts: list[str] = []
        for loc in e["loc"]:
            if isinstance(loc, int):
                parts[-1:] = [f"{parts[-1]}[{loc}]"] if parts else [f"[{loc}]"]
            else:
                parts.append(str(loc))
        path = ".".join(["spec", *parts])
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field: remove it or check its spelling against docs/crd-reference.md"
        elif e["type"] == "missing":
            msg = "is required"
        elif e["type"] == "string_pattern_mismatch" and e["ctx"]["pattern"] == DURATION_PATTERN:
            msg = f"{e.get('input')!r} is not a duration: write a whole number and a unit, e.g. 500ms, 30s, 5m, 1h, 7d"
        elif e["type"] == "string_pattern_mismatch":
            msg = f"{e.get('input')!r} does not match {e['ctx']['pattern']}"
        problems.append(Problem(path, msg))
    return problems


def validate_spec(spec: dict[str, Any]) -> tuple[models.GlassPipelineSpec, list[OutputColumn]]:
    """The parsed spec and its resolved output columns, or SpecInvalid naming every problem found."""
    try:
        parsed = models.GlassPipelineSpec.model_validate(spec)
    except ValidationError as e:
        raise SpecInvalid(_pydantic_problems(e)) from None
    checker = _Checker(parsed)
    columns = checker.run()
    if checker.problems:
        raise SpecInvalid(checker.problems)
    return parsed, columns


_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def validate_resource(resource: dict[str, Any]) -> tuple[models.GlassPipelineSpec, list[OutputColumn]]:
    """Check a whole GlassPipeline document (apiVersion, kind, metadata.name, spec)."""
    problems = []
    if resource.get("apiVersion") != models.API_VERSION:
        problems.append(Problem("apiVersion", f"must be {models.API_VERSION}, got {resource.get('apiVersion')!r}"))
    if resource.get("kind") != models.KIND:
        problems.append(Problem("kind", f"must be {models.KIND}, got {resource.get('kind')!r}"))
    name = (resource.get("metadata") or {}).get("name", "")
    if not isinstance(name, str) or not _K8S_NAME.match(name) or len(name) > 50:
        problems.append(Problem("metadata.name", f"{name!r} must be a DNS label of at most 50 characters "
                                "(lower-case letters, digits, '-'): replica applications are named <name>-<i>"))
    if not isinstance(resource.get("spec"), dict):
        problems.append(Problem("spec", "is required"))
    if problems:
        raise SpecInvalid(problems)
    return validate_spec(resource["spec"])
