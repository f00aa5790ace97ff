import math

from prometheus_client import CollectorRegistry, Histogram

from outbox.metrics import BatchHistogram

BUCKETS = (0.01, 0.1, 1, 10)


def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels.get("le", "")): sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if not sample.name.endswith("_created")
    }


def test_a_batch_observed_at_once_counts_as_each_value_observed_alone():
    # On a bucket's bound (counted in it), between bounds, past the last, below zero.
    lags = [0.01, 0.005, 0.01, 0.5, 1.0, 1.0000001, 9.99, 10, 11, 1e9, -1.0, 0.0, 0.1]
    one_by_one, at_once = CollectorRegistry(), CollectorRegistry()
    alone = Histogram("lag", "", buckets=BUCKETS, registry=one_by_one)
    batch = BatchHistogram("lag", "", buckets=BUCKETS, registry=at_once)
    for lag in lags:
        alone.observe(lag)
    batch.observe_many(lags)
    batch.observe_many([])

    assert samples(at_once) == samples(one_by_one)
    assert samples(at_once)[("lag_bucket", "+Inf")] == len(lags)
    assert math.isclose(samples(at_once)[("lag_sum", "")], sum(lags))


def test_its_labelled_children_take_batches_too():
    registry = CollectorRegistry()
    batch = BatchHistogram("lag", "", ["topic"], buckets=BUCKETS, registry=registry)
    batch.labels(topic="a").observe_many([0.5, 5])
    assert samples(registry)[("lag_bucket", "1.0")] == 1
    assert samples(registry)[("lag_count", "")] == 2
