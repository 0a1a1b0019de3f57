"""An INSERT of one block whose columns are already in ClickHouse's Native format (native_block.py), over
clickhouse-driver's connection: the driver's own ``execute`` wants Python values and would convert every one.

This follows the driver's ``process_insert_query`` (query, the server's sample block, the data block, an empty
block, end of stream) with the driver's own packet helpers, only writing the data block's column bytes as they
are. It is used only with the driver's ``Client`` without compression, and only when the server's sample block
has the column types the bytes were encoded for; otherwise it ends the INSERT with no rows and says so, and the
caller sends the chunk the driver's way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EncodedColumn:
    name: str
    ch_type: str
    data: bytes  # native_block.encode_column


def can_insert_encoded(client: Any) -> bool:
    """Whether ``client`` is clickhouse-driver's Client (unit tests pass a fake) without compression."""
    from clickhouse_driver import Client

    return isinstance(client, Client) and not client.connection.compression


def insert_encoded(client: Any, query: str, columns: Sequence[EncodedColumn], rows: int,
                   settings: Mapping[str, Any]) -> bool:
    """Run ``query`` (``INSERT INTO t (columns...) VALUES``) with ``columns`` as its one block; False when the
    server's sample block does not have the encoded types (nothing was inserted: send the chunk another way)."""
    from clickhouse_driver import defines
    from clickhouse_driver.block import BlockInfo, ColumnOrientedBlock
    from clickhouse_driver.protocol import ClientPacketTypes
    from clickhouse_driver.varint import write_varint
    from clickhouse_driver.writer import write_binary_str, write_binary_uint8

    with client.disconnect_on_error(query, dict(settings)):
        connection = client.connection
        connection.send_query(query)
        connection.send_external_tables(None)
        sample = client.receive_sample_block()
        expected = [(c.name, c.ch_type) for c in columns]
        matches = sample is not None and [(n, t) for n, t in sample.columns_with_types] == expected
        if matches:
            revision = connection.server_info.used_revision
            out = connection.fout
            write_varint(ClientPacketTypes.DATA, out)
            if revision >= defines.DBMS_MIN_REVISION_WITH_TEMPORARY_TABLES:
                write_binary_str("", out)  # no external table's name
            if revision >= defines.DBMS_MIN_REVISION_WITH_BLOCK_INFO:
                BlockInfo().write(out)
            write_varint(len(columns), out)
            write_varint(rows, out)
            for column in columns:
                write_binary_str(column.name, out)
                write_binary_str(column.ch_type, out)
                if revision >= defines.DBMS_MIN_REVISION_WITH_CUSTOM_SERIALIZATION:
                    write_binary_uint8(0, out)  # no custom serialization
                out.write(column.data)
            out.flush()
            client.receive_profile_events()
        if sample is not None:
            connection.send_data(ColumnOrientedBlock())  # the end of the INSERT's data
            client.receive_profile_events()
            client.receive_end_of_insert_query()
        return matches
