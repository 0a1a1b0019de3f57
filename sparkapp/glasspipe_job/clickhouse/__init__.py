"""The exactly-once ClickHouse sink, one concern per module (docs/exactly-once.md explains the protocol).

``names`` what the sink writes into ClickHouse besides the rows; ``errors`` which server errors are
retried and how permanent ones are explained; ``values`` Python values in the form the driver writes;
``mechanism`` marker column or deduplication token, by server version and engine; ``connection`` the
client, reconnects and retries; ``table`` the data table's DDL and inspection; ``ledger`` the ledger rows
and the roll-back of abandoned batches (read by ``glasspipe_job.handover``); ``sink`` one micro-batch
written in chunks, exactly once.

Nothing here imports pyspark: the sink gets plain Python columns, so it is unit-tested without a JVM.
"""
