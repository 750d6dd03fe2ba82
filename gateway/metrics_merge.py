"""One ``/metrics`` for a node whose requests two processes serve.

``gateway serve --data-plane haproxy`` runs the data-plane replica's forwarder in a
process of its own (``gateway/local_replica.py``): the streams, ``generate`` calls,
misses and shadow share it serves are counted there, everything HAProxy carries is
counted in the control plane. The control plane's ``/metrics`` answers for both: the
replica's exposition is merged into its own, sample by sample, with prometheus-client's
parser and renderer.

- Counters and histograms count disjoint requests: samples with the same name and labels
  add up (``_created``: the earlier).
- Gauges that count load (requests in flight or queued, a pool's saturation) add up too,
  as Prometheus sums them over a cluster's replicas.
- Every other gauge says what the control plane knows (member health, versions, a
  rollout's share): the control plane's value stands, the replica's is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

# gauges that count load: summed over the processes that carry it
ADDITIVE_GAUGES = frozenset({
    "infergate_in_flight_requests", "infergate_queued_requests",
    "infergate_pool_saturation", "infergate_tenant_in_flight_requests",
})


def _key(sample: Sample) -> tuple[str, tuple[tuple[str, str], ...]]:
    return sample.name, tuple(sorted(sample.labels.items()))


def _merged(own: Metric, other: Metric) -> Metric:
    if own.type == "gauge" and own.name not in ADDITIVE_GAUGES:
        return own
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {
        _key(s): s for s in own.samples}
    for sample in other.samples:
        key = _key(sample)
        mine = samples.get(key)
        if mine is None:
            samples[key] = sample
        elif sample.name.endswith("_created"):
            samples[key] = mine._replace(value=min(mine.value, sample.value))
        else:
            samples[key] = mine._replace(value=mine.value + sample.value)
    merged = Metric(own.name, own.documentation, own.type, own.unit)
    merged.samples = list(samples.values())
    return merged


class _Families:
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def merge_exposition(own: str, other: str) -> bytes:
    """``own`` (the control plane's exposition) with ``other``'s (the replica's) merged
    in, rendered again in the text format."""
    mine = {f.name: f for f in text_string_to_metric_families(own)}
    for family in text_string_to_metric_families(other):
        mine[family.name] = _merged(mine[family.name], family) if family.name in mine \
            else family
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(mine.values()))
    return generate_latest(registry)
