"""The prometheus-adapter rule's PromQL, run by a real Prometheus scraping a real gateway
under load, returns the pool saturation the gateway itself reports.

Prometheus is Debian's ``prometheus`` binary (``make system-deps``), started on a free
loopback port with a throw-away config that scrapes the session's gateway every 0.5 s and
labels the target ``namespace="infergate"``, as the Prometheus Operator does through the
ServiceMonitor. The adapter's Go template is filled in as prometheus-adapter does for an
External metric request with selector ``pool=<pool>`` from an HPA in ``infergate``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import tritonclient.http as httpclient
import yaml
from prometheus_client.parser import text_string_to_metric_families

from converters.samples import INPUT_NAME, SAMPLE_MODEL_NAME, cat_input
from infergate.processes import stop_process
from infergate.triton.local import free_port
from tests.k8s.conftest import K8S
from tests.procs import GatewayProcess, wait_until

pytestmark = pytest.mark.integration

ADAPTER_CONFIG = K8S / "monitoring" / "prometheus-adapter" / "config.yaml"
DASHBOARD = K8S / "monitoring" / "grafana-dashboard.json"
NAMESPACE = "infergate"
POOL = "local"  # the pool name of the session's gateway fixture
SCRAPE_S = 0.5
CONCURRENCY = 12  # > capacity_per_member (8): saturation well above 1 while loaded
PAIRS = 5  # loaded samples the adapter's query is checked against (at least 4 must come)


def render_external_query(
    rule: dict[str, object], selector: dict[str, str], namespace: str
) -> str:
    """prometheus-adapter's BuildExternal for equality selectors: the selector's matchers,
    then the namespace matcher (namespace override), joined by commas."""
    template = str(rule["metricsQuery"])
    used = set(re.findall(r"<<\s*\.(\w+)\s*>>", template))
    assert used <= {"Series", "LabelMatchers"}, f"template fields not rendered here: {used}"
    series = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", str(rule["seriesQuery"]))
    assert series is not None
    matchers = [f'{k}="{v}"' for k, v in selector.items()] + [f'namespace="{namespace}"']
    return (template.replace("<<.Series>>", series.group(1))
            .replace("<<.LabelMatchers>>", ",".join(matchers)))


@dataclass
class Prometheus:
    url: str
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=5, trust_env=False))

    def query(self, promql: str, at: float | None = None) -> list[dict[str, object]]:
        params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
        body = self.client.get(f"{self.url}/api/v1/query", params=params).json()
        assert body["status"] == "success", body
        return body["data"]["result"]  # type: ignore[no-any-return]

    def scalar(self, promql: str, at: float | None = None) -> float | None:
        result = self.query(promql, at)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None  # type: ignore[index]

    def series(self, match: str) -> list[dict[str, str]]:
        body = self.client.get(f"{self.url}/api/v1/series", params={"match[]": match}).json()
        assert body["status"] == "success", body
        return body["data"]  # type: ignore[no-any-return]


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        message = "Debian 'prometheus' is not installed: run 'make system-deps'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(f"NOT CHECKED: {message}")
    return binary


@pytest.fixture(scope="module")
def prometheus(
    gateway: GatewayProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    binary = prometheus_binary()
    tmp_path = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{
            "job_name": "infergate-gateway",
            "scrape_interval": f"{int(SCRAPE_S * 1000)}ms",
            "scrape_timeout": f"{int(SCRAPE_S * 800)}ms",
            "metrics_path": "/metrics",
            "static_configs": [{"targets": [gateway.http_url],
                                "labels": {"namespace": NAMESPACE,
                                           "service": "infergate-gateway"}}],
        }],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    prom = Prometheus(f"http://127.0.0.1:{port}")
    try:
        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            with contextlib.suppress(httpx.HTTPError):
                return prom.client.get(f"{prom.url}/-/ready").status_code == 200
            return False

        assert wait_until(ready, 30), "prometheus not ready"
        yield prom
    finally:
        prom.client.close()
        stop_process(proc)
        log.close()


def gateway_saturation(client: httpx.Client, gateway: GatewayProcess) -> float | None:
    text = client.get(f"http://{gateway.http_url}/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == "infergate_pool_saturation":
            for sample in family.samples:
                if sample.labels.get("pool") == POOL:
                    return float(sample.value)
    return None


@contextlib.contextmanager
def load(gateway: GatewayProcess, seconds_max: float) -> Iterator[threading.Event]:
    """CONCURRENCY closed-loop HTTP clients until the block exits (at most seconds_max)."""
    stop = threading.Event()
    deadline = time.monotonic() + seconds_max
    x = cat_input()

    def client_loop() -> None:
        client = httpclient.InferenceServerClient(gateway.http_url)
        inp = httpclient.InferInput(INPUT_NAME, list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    client.infer(SAMPLE_MODEL_NAME, [inp])
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(CONCURRENCY)]
    for t in threads:
        t.start()
    try:
        yield stop
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)


@contextlib.contextmanager
def gauge_recorder(gateway: GatewayProcess) -> Iterator[list[tuple[float, float]]]:
    """(wall time, saturation) read from the gateway's /metrics every 50 ms."""
    readings: list[tuple[float, float]] = []
    stop = threading.Event()

    def loop() -> None:
        with httpx.Client(timeout=2, trust_env=False) as client:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    value = gateway_saturation(client, gateway)
                    if value is not None:
                        readings.append((time.time(), value))
                stop.wait(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield readings
    finally:
        stop.set()
        thread.join(timeout=10)


# HAProxy only, the gateway's default plane. The rule, Prometheus and the exposition's
# format are the same whichever plane carries inference: both serve /metrics from the
# control plane's one app (gateway/control/http_app.py, CONTROL_HTTP_PATHS), and the gauge
# each plane feeds rises under load and falls after on both planes in
# tests/gateway/test_overload.py::test_gateway_saturation_rises_under_load_and_falls_after.
# What only this test holds is the session gateway's layout: with HAProxy its replica runs
# in a process of its own and /metrics merges that process's gauge in (metrics_merge.py),
# the sum the adapter must still read exactly; the Python plane has no such merge.
@pytest.mark.parametrize("gateway", ["haproxy"], indirect=True)
def test_adapter_query_returns_the_gateway_saturation_when_under_load(
    gateway: GatewayProcess, prometheus: Prometheus
) -> None:
    (rule,) = yaml.safe_load(ADAPTER_CONFIG.read_text())["externalRules"]
    query = render_external_query(rule, {"pool": POOL}, NAMESPACE)
    sample_time = f'timestamp(infergate_pool_saturation{{pool="{POOL}",namespace="{NAMESPACE}"}})'
    raw = f'infergate_pool_saturation{{pool="{POOL}",namespace="{NAMESPACE}"}}'
    pairs: list[tuple[float, float]] = []  # (sample timestamp, adapter query value)
    # The load starts at once: a Prometheus this old (2.42) applies its targets on a fixed
    # 5 s tick, so its first scrape comes 5 s after its start, and the load ramps up
    # meanwhile instead of after. Samples of the ramp are still left out (loaded_at).
    with gauge_recorder(gateway) as readings, load(gateway, seconds_max=40) as stop:
        assert wait_until(lambda: any(v >= 1.0 for _, v in readings), 10), readings[-5:]
        loaded_at = time.time()
        assert wait_until(lambda: prometheus.series(rule["seriesQuery"]), 15)
        assert prometheus.series(rule["seriesQuery"])[0]["pool"] == POOL
        deadline = time.monotonic() + 15
        while len(pairs) < PAIRS and time.monotonic() < deadline:
            time.sleep(SCRAPE_S)
            # two scrape intervals back: every scrape that started by then is stored (a
            # scrape times out after 0.8 interval), so the queries below see one sample
            now = time.time() - 2 * SCRAPE_S
            if now < loaded_at + 2 * SCRAPE_S:
                continue  # a sample of the ramp, scraped while the load began
            value, at = prometheus.scalar(query, now), prometheus.scalar(sample_time, now)
            if value is not None and at is not None:
                # One gateway replica: the adapter's sum is exactly the scraped sample.
                assert value == prometheus.scalar(raw, now), (value, now)
                pairs.append((at, value))
        stop.set()
    # The scraped series is, by definition, what the gateway's /metrics said at each
    # scrape; the test's own reads, milliseconds apart, are other draws of a moving value
    # (the gauge jumps by whole dynamic batches, and by the members' queue depth once per
    # probe round), so they are no yardstick for one sample. What the rule must do is
    # pick that series and keep its value (checked exactly above, on samples stored
    # before the queries ran), and show the load and its end (below).
    assert len(pairs) >= 4, pairs
    for at, value in pairs:
        nearby = [v for t, v in readings if abs(t - at) <= 1.0]
        print(f"adapter {value:.3f} at {at:.2f}; gateway /metrics within 1 s: "
              f"{min(nearby, default=float('nan')):.3f}..{max(nearby, default=float('nan')):.3f}")
    peak = max(v for _, v in pairs)
    assert peak >= 1.0, pairs  # 12 clients over capacity 8: the load is visible
    # Load gone: the same query follows the gauge back down.
    assert wait_until(lambda: (prometheus.scalar(query) or 0.0) <= 0.25 * peak, 15)


def test_dashboard_queries_evaluate_in_prometheus(
    gateway: GatewayProcess, prometheus: Prometheus
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert wait_until(lambda: prometheus.series("infergate_pool_saturation"), 15)
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = (target["expr"].replace("$namespace", NAMESPACE)
                    .replace("$pool", ".*").replace("$model", ".*")
                    .replace("$__rate_interval", "1m"))
            prometheus.query(expr)  # asserts status == success (valid PromQL)
