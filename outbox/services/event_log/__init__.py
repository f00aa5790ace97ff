"""The event-log relay's reads and writes, one module per job: shards (which relay owns which
keys), ticks (transaction snapshots), spans (the events between two ticks, in the order they
are sent), cursors (how far each shard went), deliveries (the record of each try), held (the
keys held back by a failure, and the operators' repairs of them) and batches (a sent batch
written down). Nothing here updates or deletes an event row.

An event carries the id of the transaction that wrote it (`txid`, set by PostgreSQL at insert).
A tick records a transaction snapshot. The events between tick A and the next tick B (a span)
are those whose transaction had ended when B was taken but not when A was: the events that
became visible between the two ticks, found by short index walks that no long-running read or
write, dead row or key pattern slows down. Spans go in the order of their ticks, the events of
a span in position order (spans.batch_read). A cursor says how far each shard went, as an
appended row.
"""
