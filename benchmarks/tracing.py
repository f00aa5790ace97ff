"""What the benchmarks' tracing comparisons share: the SDK set up as a traced process has it
(100 % sampling, a batch span processor) with an exporter that drops the spans, and the
table of a component's rate and CPU with tracing off and on."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# Off and on alternate this many times; the best of each is compared.
TRACING_ROUNDS = 3
# The second "on": a deployment that samples one trace in this many at its root.
SAMPLED_ONE_IN = 10


@dataclass(frozen=True)
class Measured:
    """One run: events/s, and this process's CPU (every thread) per event over the same span
    of work as the rate."""

    rate: float
    cpu_us_per_event: float


class SpanCounter:
    """How many spans the exporter of a tracing_on() run was given."""

    exported = 0


@contextmanager
def tracing_on(queue_size: int) -> Iterator[SpanCounter]:
    """Spans made through kafka_events.tracing while the block runs are recorded by the SDK with
    its default sampler (parent-based, always on: 100 % of the traces their roots sampled)
    and a batch span processor, and then dropped: the cost measured is making them and the
    processor's, not a collector's. All are exported when the block ends."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    from kafka_events.tracing import use_tracer_provider

    counter = SpanCounter()

    class DroppingExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            counter.exported += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(ALWAYS_ON))
    # A queue as long as the run: no span is dropped before the exporter sees it.
    provider.add_span_processor(BatchSpanProcessor(DroppingExporter(), max_queue_size=queue_size))
    use_tracer_provider(provider)
    try:
        yield counter
    finally:
        use_tracer_provider(None)
        provider.shutdown()  # exports what is queued


def print_comparison(
    component: str, off: list[Measured], on: list[Measured], *, header: bool = True
) -> None:
    """The best of each (the highest rate, the lowest CPU per event), their ratios, and every
    run's figures; with `header`, the columns' names and the "off" row first."""
    best_off, best_on = max(m.rate for m in off), max(m.rate for m in on)
    cpu_off = min(m.cpu_us_per_event for m in off)
    cpu_on = min(m.cpu_us_per_event for m in on)
    if header:
        print(f"  {'':<52}{'events/s':>10}{'CPU µs/event':>14}")
        print(f"  {component + ', tracing off (API only)':<52}{best_off:>10,.0f}{cpu_off:>14,.0f}")
        component += ", tracing on (SDK, 100 %, batch processor)"
    print(f"  {component:<52}{best_on:>10,.0f}{cpu_on:>14,.0f}")
    print(f"  {'on / off':<52}{best_on / best_off:>10.2f}{cpu_on / cpu_off:>14.2f}")
    for name, figure in (("events/s", "rate"), ("CPU µs/event", "cpu_us_per_event")):
        runs = [", ".join(f"{getattr(m, figure):,.0f}" for m in mode) for mode in (off, on)]
        print(f"  every run, {name}: off {runs[0]}; on {runs[1]}")
