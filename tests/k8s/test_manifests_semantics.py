"""What schemas cannot check: the rendered objects refer to each other correctly, the
autoscaler watches a metric the gateway really exports, the container command lines are
ones the real CLIs accept, and the MIG requests match layouts a GPU can hold."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import load_gateway_config
from gateway.metrics import create_metrics
from scheduler.migparted import operator_configs
from tests.k8s.conftest import K8S, Obj, container, find, kustomize_build, of_kind, pod_spec
from tests.procs import ROOT

WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")
MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(\d)g\.(\d+)gb$")
ADAPTER_CONFIG = K8S / "monitoring" / "prometheus-adapter" / "config.yaml"
DASHBOARD = K8S / "monitoring" / "grafana-dashboard.json"


def workloads(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] in WORKLOADS]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pods_selected(objects: list[Obj], namespace: str, selector: dict[str, str]) -> list[Obj]:
    return [w for w in workloads(objects) if w["metadata"].get("namespace") == namespace
            and selects(selector, w["spec"]["template"]["metadata"]["labels"])]


def port_names(workload: Obj) -> set[str]:
    return {p["name"] for c in pod_spec(workload)["containers"] for p in c.get("ports", [])}


def gateway_metric_names() -> set[str]:
    names = set()
    for family in create_metrics().registry.collect():
        names.add(family.name)
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        names.update(family.name + s for s in suffixes.get(family.type, []))
    return names


def gateway_pools(objects: list[Obj], tmp_path: Path) -> tuple[Any, ...]:
    """The pools ConfigMap, parsed by the gateway's own loader (as the pod will)."""
    path = tmp_path / "pools.yaml"
    path.write_text(find(objects, "ConfigMap", "infergate-pools")["data"]["pools.yaml"])
    return tuple(load_gateway_config(path).pools)


def cli_help(*module_args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", *module_args, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def flag_names(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


# -- references between objects ----------------------------------------------------------

def test_every_service_selects_pods_exposing_its_target_ports(
    rendered: dict[str, list[Obj]],
) -> None:
    for objects in rendered.values():
        for svc in of_kind(objects, "Service"):
            pods = pods_selected(objects, svc["metadata"]["namespace"], svc["spec"]["selector"])
            assert len(pods) == 1, f"Service {svc['metadata']['name']} selects {len(pods)}"
            wanted = {p["targetPort"] for p in svc["spec"]["ports"]}
            assert wanted <= port_names(pods[0]), svc["metadata"]["name"]


def test_every_disruption_budget_covers_exactly_one_workload(
    rendered: dict[str, list[Obj]],
) -> None:
    for objects in rendered.values():
        for pdb in of_kind(objects, "PodDisruptionBudget"):
            selector = pdb["spec"]["selector"]["matchLabels"]
            assert len(pods_selected(objects, pdb["metadata"]["namespace"], selector)) == 1


def test_probes_point_at_declared_ports(rendered: dict[str, list[Obj]]) -> None:
    for objects in rendered.values():
        for workload in workloads(objects):
            for c in pod_spec(workload)["containers"]:
                declared = {p["name"] for p in c.get("ports", [])}
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if probe in c:
                        handler = c[probe].get("httpGet") or c[probe].get("tcpSocket")
                        if handler is None:  # an exec probe names no port
                            assert c[probe]["exec"]["command"], (workload["metadata"], probe)
                            continue
                        assert handler["port"] in declared, (workload["metadata"]["name"], probe)


def test_referenced_objects_exist(rendered: dict[str, list[Obj]]) -> None:
    for objects in rendered.values():
        priority_classes = {o["metadata"]["name"] for o in of_kind(objects, "PriorityClass")}
        for workload in workloads(objects):
            spec = pod_spec(workload)
            ns = workload["metadata"]["namespace"]
            name = spec.get("priorityClassName", "")
            assert name in priority_classes or name.startswith("system-"), name
            if "serviceAccountName" in spec:
                find(objects, "ServiceAccount", spec["serviceAccountName"])
            for volume in spec.get("volumes", []):
                if "configMap" in volume:
                    cm = find(objects, "ConfigMap", volume["configMap"]["name"])
                    assert cm["metadata"]["namespace"] == ns
                if "persistentVolumeClaim" in volume:
                    find(objects, "PersistentVolumeClaim",
                         volume["persistentVolumeClaim"]["claimName"])


def test_service_monitors_select_services_with_the_scraped_port(
    rendered: dict[str, list[Obj]],
) -> None:
    for objects in rendered.values():
        for monitor in of_kind(objects, "ServiceMonitor"):
            namespaces = monitor["spec"]["namespaceSelector"]["matchNames"]
            services = [s for s in of_kind(objects, "Service")
                        if s["metadata"]["namespace"] in namespaces
                        and selects(monitor["spec"]["selector"]["matchLabels"],
                                    s["metadata"]["labels"])]
            assert services, monitor["metadata"]["name"]
            for svc in services:
                ports = {p["name"] for p in svc["spec"]["ports"]}
                assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


# -- the autoscaling chain: gateway metric -> adapter rule -> HPA -> Deployment ----------

def test_pool_hpa_scales_the_pool_on_the_metric_the_gateway_exports(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    adapter = yaml.safe_load(ADAPTER_CONFIG.read_text())
    exposed = {rule["name"]["as"] for rule in adapter["externalRules"]}
    for objects in rendered.values():
        pools = {p.name for p in gateway_pools(objects, tmp_path)}
        hpa = find(objects, "HorizontalPodAutoscaler", "triton-efficientnet-lite0")
        target = find(objects, "Deployment", hpa["spec"]["scaleTargetRef"]["name"])
        assert target["metadata"]["labels"]["app.kubernetes.io/component"] == "triton-pool"
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "External"
        name = metric["external"]["metric"]["name"]
        assert name in exposed and name in gateway_metric_names()
        assert metric["external"]["metric"]["selector"]["matchLabels"]["pool"] in pools
        # saturation is already per unit of capacity: Value, not AverageValue
        assert metric["external"]["target"]["type"] == "Value"
        assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]


def test_pool_hpa_scales_up_at_once_and_down_slower_than_a_cold_start(
    rendered: dict[str, list[Obj]],
) -> None:
    for objects in rendered.values():
        hpa = find(objects, "HorizontalPodAutoscaler", "triton-efficientnet-lite0")
        behavior = hpa["spec"]["behavior"]
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
        triton = container(find(objects, "Deployment", "triton-efficientnet-lite0"),
                           "tritonserver")
        startup = triton["startupProbe"]
        cold_start_budget = startup["periodSeconds"] * startup["failureThreshold"]
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= cold_start_budget
        assert all(p["type"] == "Pods" and p["value"] == 1
                   for p in behavior["scaleDown"]["policies"])


def test_hpa_targets_leave_the_replica_count_to_the_hpa(rendered: dict[str, list[Obj]]) -> None:
    for objects in rendered.values():
        for hpa in of_kind(objects, "HorizontalPodAutoscaler"):
            target = find(objects, "Deployment", hpa["spec"]["scaleTargetRef"]["name"])
            # a replicas field would reset the HPA's count on every `kubectl apply`
            assert "replicas" not in target["spec"], target["metadata"]["name"]


def test_adapter_rule_reads_the_saturation_series_per_pool() -> None:
    (rule,) = yaml.safe_load(ADAPTER_CONFIG.read_text())["externalRules"]
    assert rule["seriesQuery"].startswith("infergate_pool_saturation{")
    assert rule["resources"]["overrides"]["namespace"]["resource"] == "namespace"
    assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"]
    assert re.search(r"by \(pool\)", rule["metricsQuery"])


def test_pools_config_resolves_members_from_headless_services(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    for objects in rendered.values():
        for pool in gateway_pools(objects, tmp_path):
            # DNS gives addresses only: members get the pool's DNS ports (Triton's defaults).
            ports_of_members = pool.dns_ports
            assert pool.dns, pool.name
            service, namespace = pool.dns.split(".")[:2]
            svc = find(objects, "Service", service)
            assert svc["metadata"]["namespace"] == namespace
            assert svc["spec"]["clusterIP"] == "None"
            ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
            assert ports == {"http": ports_of_members.http_port,
                             "grpc": ports_of_members.grpc_port,
                             "metrics": ports_of_members.metrics_port}


# -- command lines, shutdown, images ----------------------------------------------------

def test_gateway_args_are_options_of_the_real_cli(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["gpu-mig"]
    control = container(find(objects, "Deployment", "infergate-control-plane"), "gateway")
    agent = container(find(objects, "Deployment", "infergate-gateway"), "agent")
    for c, command in ((control, "serve"), (agent, "agent")):
        assert c["command"] == ["python", "-m", "gateway", command]
        help_text = cli_help("gateway", command)
        for flag in flag_names(c["args"]):
            assert re.search(rf"{re.escape(flag)}\b", help_text), f"gateway {command}: {flag}"


def test_scheduler_args_are_options_of_the_real_cli_when_it_exists(
    rendered: dict[str, list[Obj]],
) -> None:
    scheduler = container(find(rendered["gpu-mig"], "Deployment", "infergate-scheduler"),
                          "scheduler")
    assert scheduler["command"] == ["python", "-m", "scheduler", "serve"]
    if find_spec("scheduler.__main__") is None:
        pytest.skip("NOT CHECKED: scheduler/__main__.py does not exist yet")
    help_text = cli_help("scheduler", "serve")
    for flag in flag_names(scheduler["args"]):
        assert re.search(rf"{re.escape(flag)}\b", help_text), f"scheduler serve has no {flag}"


def _seconds(args: list[str], flag: str) -> float:
    return float(next(a.split("=", 1)[1] for a in args if a.startswith(flag + "=")))


def test_grace_period_covers_pre_stop_and_drain(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["gpu-mig"]
    triton = find(objects, "Deployment", "triton-efficientnet-lite0")
    c = container(triton, "tritonserver")
    pre_stop = float(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod_spec(triton)["terminationGracePeriodSeconds"] > pre_stop + _seconds(
        c["args"], "--exit-timeout-secs")
    control = find(objects, "Deployment", "infergate-control-plane")
    c = container(control, "gateway")
    pause = float(c["lifecycle"]["preStop"]["exec"]["command"][-1])  # ["sleep", "10"]
    assert pod_spec(control)["terminationGracePeriodSeconds"] > pause + _seconds(
        c["args"], "--drain-timeout")
    # the data plane: HAProxy's preStop waits, soft-stops, lets in-flight finish
    data = find(objects, "Deployment", "infergate-gateway")
    script = container(data, "haproxy")["lifecycle"]["preStop"]["exec"]["command"][-1]
    waits = sum(float(w) for w in re.findall(r"sleep (\d+)", script))
    assert "kill -USR1 1" in script
    assert pod_spec(data)["terminationGracePeriodSeconds"] > waits


def test_images_are_pinned_and_chosen_by_overlay(rendered: dict[str, list[Obj]]) -> None:
    expected = {"gpu-mig": "nvcr.io/nvidia/tritonserver:25.04-py3",
                "cpu-dev": "infergate/triton-cpu:dev"}
    for overlay, objects in rendered.items():
        triton = container(find(objects, "Deployment", "triton-efficientnet-lite0"),
                           "tritonserver")
        assert triton["image"] == expected[overlay]
        for workload in workloads(objects):
            for c in [*pod_spec(workload)["containers"],
                      *pod_spec(workload).get("initContainers", [])]:
                assert ":" in c["image"].rsplit("/", 1)[-1] and not c["image"].endswith(":latest")


# -- MIG --------------------------------------------------------------------------------

def accelerator_requests(objects: list[Obj]) -> dict[str, dict[str, Any]]:
    found = {}
    for workload in workloads(objects):
        for c in pod_spec(workload)["containers"]:
            resources = c.get("resources", {})
            asked = {k: v for part in ("requests", "limits")
                     for k, v in resources.get(part, {}).items() if k.startswith("nvidia.com/")}
            if asked:
                found[f"{workload['metadata']['name']}/{c['name']}"] = asked
    return found


def test_cpu_dev_requests_no_accelerator(rendered: dict[str, list[Obj]]) -> None:
    assert accelerator_requests(rendered["cpu-dev"]) == {}
    assert not [o for o in rendered["cpu-dev"] if o["kind"] == "DaemonSet"]


def test_gpu_mig_pools_request_one_mig_profile_that_a_layout_provides(
    rendered: dict[str, list[Obj]],
) -> None:
    objects = rendered["gpu-mig"]
    requests = accelerator_requests(objects)
    assert list(requests) == ["triton-efficientnet-lite0/tritonserver"]
    layouts = mig_layouts(objects)
    for asked in requests.values():
        (resource,) = asked  # one MIG device type per container
        match = MIG_RESOURCE.match(resource)
        assert match, resource
        profile = resource.removeprefix("nvidia.com/mig-")
        assert any(profile in layout for layout in layouts.values()), profile


def test_device_plugin_uses_mixed_strategy_and_fails_on_init_error(
    rendered: dict[str, list[Obj]],
) -> None:
    plugin = find(rendered["gpu-mig"], "DaemonSet", "nvidia-device-plugin-daemonset")
    c = pod_spec(plugin)["containers"][0]
    assert {"--mig-strategy=mixed", "--fail-on-init-error=true"} <= set(c["args"])
    assert accelerator_requests([plugin]) == {}  # it advertises GPUs, it cannot ask for one
    assert pod_spec(plugin)["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert "/var/lib/kubelet/device-plugins" in mounts


# Memory-slot model for the 80 GB profile names (see shared/reference/mig.md):
# profile -> (memory slices, valid start slots)
SLOTS = {
    "1g.10gb": (1, (0, 1, 2, 3, 4, 5, 6)), "1g.10gb+me": (1, (0, 1, 2, 3, 4, 5, 6)),
    "1g.20gb": (2, (0, 2, 4, 6)),
    "2g.20gb": (2, (0, 2, 4)), "3g.40gb": (4, (0, 4)), "4g.40gb": (4, (0,)),
    "7g.80gb": (8, (0,)),
}


def placeable(counts: dict[str, int]) -> bool:
    """Backtracking over start slots, most constrained profile first."""
    wanted = sorted((p for p, n in counts.items() for _ in range(n)),
                    key=lambda p: (len(SLOTS[p][1]), -SLOTS[p][0]))

    def place(i: int, used: frozenset[int]) -> bool:
        if i == len(wanted):
            return True
        size, starts = SLOTS[wanted[i]]
        for start in starts:
            span = frozenset(range(start, start + size))
            if max(span) < 8 and not span & used and place(i + 1, used | span):
                return True
        return False

    return place(0, frozenset())


A100_80GB_PCI_ID = "0x20B210DE"  # A100-SXM4-80GB, as mig-parted's device-filter names it


def mig_config(objects: list[Obj]) -> dict[str, Any]:
    cm = find(objects, "ConfigMap", "infergate-mig-parted-config")
    assert cm["metadata"]["namespace"] == "gpu-operator"  # where the MIG manager reads it
    config: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["version"] == "v1"
    return config


def mig_layouts(objects: list[Obj]) -> dict[str, dict[str, int]]:
    """Per config name, what an A100-80GB gets: entries whose device-filter names
    another GPU are skipped, as mig-parted skips them; the last matching entry wins."""
    layouts = {}
    for name, entries in mig_config(objects)["mig-configs"].items():
        for entry in entries:
            wanted = entry.get("device-filter")
            wanted = [wanted] if isinstance(wanted, str) else wanted
            if wanted and A100_80GB_PCI_ID.lower() not in [w.lower() for w in wanted]:
                continue
            if entry["mig-enabled"]:
                layouts[name] = dict(entry["mig-devices"])
    return layouts


def test_mig_parted_config_keeps_the_operators_entries_for_unlabelled_nodes(
    rendered: dict[str, list[Obj]],
) -> None:
    configs = mig_config(rendered["gpu-mig"])["mig-configs"]
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    for name, entries in operator_configs().items():
        assert configs.get(name) == entries, f"{name} differs from what the scheduler writes"


def test_mig_parted_layouts_fit_on_one_gpu(rendered: dict[str, list[Obj]]) -> None:
    layouts = mig_layouts(rendered["gpu-mig"])
    assert len(layouts) >= 2
    for name, counts in layouts.items():
        assert placeable(counts), name


def test_slot_model_rejects_layouts_the_driver_rejects() -> None:
    assert not placeable({"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1})
    assert not placeable({"1g.10gb": 8})
    assert placeable({"4g.40gb": 1, "3g.40gb": 1})


# -- Grafana ----------------------------------------------------------------------------

def test_dashboard_queries_only_metrics_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    known = gateway_metric_names()
    for expr in exprs:
        for name in re.findall(r"\b([a-z_]+)\{", expr):
            assert name in known or name.startswith(("nv_", "kube_")), name
    used = {n for e in exprs for n in re.findall(r"\b(infergate_[a-z_]+)\{", e)}
    assert "infergate_pool_saturation" in used


def test_data_plane_pod_shares_haproxy_run_dir_between_haproxy_and_agent(
    rendered: dict[str, list[Obj]],
) -> None:
    for objects in rendered.values():
        workload = find(objects, "Deployment", "infergate-gateway")
        haproxy, agent = container(workload, "haproxy"), container(workload, "agent")
        state = next(a.split("=", 1)[1] for a in agent["args"] if a.startswith("--state-dir="))
        assert "--haproxy-external" in agent["args"]
        assert f"{state}/haproxy/haproxy.cfg" in haproxy["args"][0]
        assert f"{state}/haproxy/master.sock" in haproxy["args"][0]
        for c in (haproxy, agent):
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert mounts[state] == "agent-run"
        # HAProxy owns the gateway's public ports; the agent follows the control plane
        assert {p["containerPort"] for p in haproxy["ports"]} == {8000, 8001}
        control = find(objects, "Service", "infergate-control-plane")
        ports = {p["name"]: p["port"] for p in control["spec"]["ports"]}
        assert f"--control-plane=infergate-control-plane:{ports['http']}" in agent["args"]
        assert f"--control-grpc=infergate-control-plane:{ports['grpc']}" in agent["args"]


# -- the control plane: two replicas, one leader, PostgreSQL -----------------------------

CONTROL = "infergate-control-plane"
DATABASE_SECRET = K8S / "postgres" / "secret.example.yaml"
POSTGRES = K8S / "postgres"


def control_plane(objects: list[Obj]) -> Obj:
    return find(objects, "Deployment", CONTROL)


def claims_of(objects: list[Obj], workload: Obj) -> dict[str, Obj]:
    """The workload's volume name -> the PersistentVolumeClaim it mounts."""
    return {v["name"]: find(objects, "PersistentVolumeClaim",
                            v["persistentVolumeClaim"]["claimName"])
            for v in pod_spec(workload)["volumes"] if "persistentVolumeClaim" in v}


def test_control_plane_runs_a_leader_and_a_standby_and_rolls_without_deadlock(
    rendered: dict[str, list[Obj]],
) -> None:
    for objects in rendered.values():
        spec = control_plane(objects)["spec"]
        assert spec["replicas"] == 2
        # a standby turns Ready (it serves): an ordinary rolling update, never below two
        assert spec["strategy"] == {"type": "RollingUpdate",
                                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        c = container(control_plane(objects), "gateway")
        assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
        assert "--data-plane=none" in c["args"]
        # the leader advertises its pod IP (the downward API), where a standby passes calls
        assert "--advertise-address=$(POD_IP):8000" in c["args"]
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_control_plane_budget_keeps_the_leader_and_lets_a_standby_go(
    rendered: dict[str, list[Obj]],
) -> None:
    for objects in rendered.values():
        pdb = find(objects, "PodDisruptionBudget", CONTROL)
        assert pdb["spec"]["minAvailable"] == 1 and "maxUnavailable" not in pdb["spec"]
        # the standby is never Ready: with the default policy it could be stuck whenever
        # the leader is unready too (a pool down), blocking every drain
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        assert selects(pdb["spec"]["selector"]["matchLabels"],
                       control_plane(objects)["spec"]["template"]["metadata"]["labels"])


def test_control_plane_replicas_prefer_two_nodes(rendered: dict[str, list[Obj]]) -> None:
    for objects in rendered.values():
        workload = control_plane(objects)
        anti = pod_spec(workload)["affinity"]["podAntiAffinity"]
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti  # see the comment
        (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert selects(term["podAffinityTerm"]["labelSelector"]["matchLabels"],
                       workload["spec"]["template"]["metadata"]["labels"])
        # and still never on GPU serving nodes
        terms = pod_spec(workload)["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]} in \
            terms[0]["matchExpressions"]


def test_control_plane_probes_follow_what_a_replica_serves_as_the_standby_answers_them(
    rendered: dict[str, list[Obj]], tmp_path: Path,
) -> None:
    from fastapi.testclient import TestClient

    from gateway.auth import TokenTable
    from gateway.config import GatewayConfig
    from gateway.control.standby import Standby
    from gateway.lifecycle.records.leader import Leadership

    for objects in rendered.values():
        c = container(control_plane(objects), "gateway")
        assert c["readinessProbe"]["httpGet"]["path"] == "/v1/replica"
        assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    # the real standby, whose database cannot be reached (served in
    # tests/gateway/control/test_standby_app.py where it can)
    config = GatewayConfig.model_validate({
        "pools": [{"name": "p", "dns": "triton.svc"}],
        "lifecycle": {"repository": str(tmp_path / "repo"), "state_dir": str(tmp_path)}})
    standby = TestClient(Standby(Leadership("postgresql://infergate@127.0.0.1:1/x"),
                                 TokenTable(), config).app)
    assert standby.get("/v2/health/live").status_code == 200  # not restarted
    assert standby.get("/v1/replica").status_code == 503  # no database: not in the Service
    leads = standby.get("/v1/leader")  # who leads: not this one
    assert leads.status_code == 503 and "Retry-After" in leads.headers
    assert leads.json()["state"] == "follower"
    assert standby.get("/v2/health/ready").status_code == 503  # no leader to pass it to


def test_control_plane_reads_its_database_url_from_the_secret_only(
    rendered: dict[str, list[Obj]],
) -> None:
    template = yaml.safe_load(DATABASE_SECRET.read_text())
    for objects in rendered.values():
        env = {e["name"]: e for e in container(control_plane(objects), "gateway")["env"]}
        ref = env["INFERGATE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
        # required: without it two replicas would be two SQLite control planes
        assert ref == {"name": "infergate-database", "key": "url"}
        assert (template["metadata"]["name"], template["kind"]) == (ref["name"], "Secret")
        assert ref["key"] in template["stringData"]
        config = yaml.safe_load(find(objects, "ConfigMap", "infergate-pools")["data"]
                                ["pools.yaml"])
        assert "database_url" not in config["lifecycle"]  # the password stays in the Secret
        # no credentials are rendered: the Secrets are created by hand
        assert not of_kind(objects, "Secret")


def test_database_secret_template_holds_a_placeholder_not_a_password() -> None:
    from urllib.parse import urlsplit

    data = yaml.safe_load(DATABASE_SECRET.read_text())["stringData"]
    url = urlsplit(data["url"])
    assert url.scheme == "postgresql" and url.password == data["password"] == "REPLACE-ME"
    # it is the development PostgreSQL's address
    host, namespace = url.hostname.split(".")[:2]
    assert (host, namespace, url.port, url.path) == (
        "infergate-postgres", "infergate", 5432, "/infergate")
    for kustomization in K8S.rglob("kustomization.yaml"):  # no `apply -k` sends it
        k = yaml.safe_load(kustomization.read_text())
        used = [*k.get("resources", []), *(p.get("path", "") for p in k.get("patches", []))]
        assert not [u for u in used if u.endswith("secret.example.yaml")], kustomization


def test_control_plane_shares_read_write_volumes_every_replica_can_mount(
    rendered: dict[str, list[Obj]],
) -> None:
    for name, objects in rendered.items():
        workload = control_plane(objects)
        claims = claims_of(objects, workload)
        assert {v: c["metadata"]["name"] for v, c in claims.items()} == {
            "models": "infergate-model-repo", "state": "infergate-control-state"}
        mounts = {m["name"]: m for m in container(workload, "gateway")["volumeMounts"]}
        assert not mounts["models"].get("readOnly")  # the leader writes versions
        config = yaml.safe_load(find(objects, "ConfigMap", "infergate-pools")["data"]
                                ["pools.yaml"])
        assert config["lifecycle"]["repository"] == mounts["models"]["mountPath"]
        assert config["lifecycle"]["state_dir"] == mounts["state"]["mountPath"]
        anti = pod_spec(workload)["affinity"]["podAntiAffinity"]
        for claim in claims.values():
            modes = claim["spec"]["accessModes"]
            if name == "cpu-dev":  # one node: ReadWriteOnce, both replicas on it
                assert modes == ["ReadWriteOnce"]
                assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
            else:  # two replicas on two nodes
                assert modes == ["ReadWriteMany"], claim["metadata"]["name"]
        # Triton serves the same repository, read-only (cpu-dev seeds it from an init
        # container first)
        triton = find(objects, "Deployment", "triton-efficientnet-lite0")
        repo = next(v for v in pod_spec(triton)["volumes"] if v["name"] == "models")
        assert repo["persistentVolumeClaim"]["claimName"] == "infergate-model-repo"
        serving = {m["name"]: m for m in container(triton, "tritonserver")["volumeMounts"]}
        assert serving["models"]["readOnly"] is True
    # the base, which every production overlay starts from
    base = kustomize_build(K8S / "base")
    for claim in claims_of(base, control_plane(base)).values():
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_development_postgres_is_where_the_secret_template_points(
    rendered: dict[str, list[Obj]],
) -> None:
    objects = rendered["cpu-dev"]  # the dev overlay brings its PostgreSQL
    db = find(objects, "StatefulSet", "infergate-postgres")
    svc = find(objects, "Service", "infergate-postgres")
    assert svc["metadata"]["namespace"] == "infergate"
    assert {p["port"] for p in svc["spec"]["ports"]} == {5432}
    env = {e["name"]: e for e in container(db, "postgres")["env"]}
    assert env["POSTGRES_USER"]["value"] == env["POSTGRES_DB"]["value"] == "infergate"
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "infergate-database", "key": "password"}
    # production brings its own database
    assert not of_kind(rendered["gpu-mig"], "StatefulSet")


def test_cloudnative_pg_example_is_a_session_level_database_for_the_control_plane() -> None:
    (cluster,) = kustomize_build(POSTGRES / "cloudnative-pg")
    assert (cluster["apiVersion"], cluster["kind"]) == ("postgresql.cnpg.io/v1", "Cluster")
    assert cluster["metadata"]["namespace"] == "infergate"
    spec = cluster["spec"]
    assert spec["instances"] >= 2  # a replica to promote
    assert spec["bootstrap"]["initdb"] == {"database": "infergate", "owner": "infergate"}
    assert spec["affinity"]["topologyKey"] == "kubernetes.io/hostname"
    # README's copy of the operator's app Secret names what the operator creates
    readme = (K8S / "README.md").read_text()
    assert f"{cluster['metadata']['name']}-app" in readme
    assert f"{cluster['metadata']['name']}-rw" in readme
