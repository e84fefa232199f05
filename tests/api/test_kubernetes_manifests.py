"""deploy/kubernetes: every object valid against the Kubernetes schemas (offline, strict), and the
references between the manifests, the Dockerfile and the code hold: every flag parses, probe paths
exist on the apps, ports agree, the drain fits the grace period, the router's --replicas-dns names
the headless Service, the autoscaler's metric is one the server exports."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest

from api.app import create_app
from api.cli import build_parser
from api.lifecycle.server import CLOSE_GRACE_S
from api.router.app import create_router_app
from api.router.config import RouterConfig
from api.router.discovery import DnsReplicas
from engine.config import EngineConfig
from tests.kubernetes_manifests import BASE, ROOT, Obj, find, load_kustomization

KUBERNETES_VERSION = "1.33.0"
VARIANTS = {"cpu": BASE, "gpu": BASE / "gpu"}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def objects(request: pytest.FixtureRequest) -> list[Obj]:
    return load_kustomization(VARIANTS[request.param])


def pod_spec(objects: list[Obj], kind: str, name: str) -> Obj:
    return find(objects, kind, name)["spec"]["template"]["spec"]


def container(objects: list[Obj], kind: str, name: str) -> Obj:
    return pod_spec(objects, kind, name)["containers"][0]


def variables(objects: list[Obj], c: Obj) -> dict[str, str]:
    """What $(NAME) in the container's args resolves to: its ConfigMap, Secret, then env."""
    found: dict[str, str] = {}
    for source in c.get("envFrom", []):
        ref = source.get("configMapRef") or source.get("secretRef")
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        obj = find(objects, kind, ref["name"])
        found.update(obj.get("data") or obj.get("stringData") or {})
    found.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
    return found


def resolved_args(objects: list[Obj], c: Obj) -> list[str]:
    values = variables(objects, c)

    def value(match: re.Match) -> str:
        assert match.group(1) in values, f"$({match.group(1)}) is defined nowhere"
        return str(values[match.group(1)])

    return [re.sub(r"\$\((\w+)\)", value, arg) for arg in c["args"]]


def flag(args: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"--{name}="))


def test_every_object_is_valid_against_the_kubernetes_schemas(objects: list[Obj]) -> None:
    assert {o["kind"] for o in objects} >= {
        "ConfigMap", "Secret", "Service", "StatefulSet", "Deployment",
        "PodDisruptionBudget", "HorizontalPodAutoscaler",
    }  # fmt: skip
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_schemas_catch_a_broken_object(objects: list[Obj]) -> None:
    """The validation above is not vacuous: a misspelt field fails it."""
    broken = {**find(objects, "PodDisruptionBudget", "radixcache")}
    broken["spec"] = {**broken["spec"], "maxUnavailabel": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_every_container_command_line_parses_with_our_cli(objects: list[Obj]) -> None:
    parser = build_parser()
    specs = [("StatefulSet", "radixcache"), ("Deployment", "radixcache-router")]
    for kind, name in specs:
        spec = pod_spec(objects, kind, name)
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c["command"] == ["radixcache"]
            parser.parse_args(resolved_args(objects, c))  # exits (fails) on a bad flag


def test_probe_paths_exist_on_the_apps_they_probe(objects: list[Obj], tmp_path: Path) -> None:
    server_paths = set(create_app(EngineConfig(model=str(tmp_path))).openapi()["paths"])
    dns = DnsReplicas("radixcache-replicas", 8000)
    router_config = RouterConfig(replicas=(), tokenizer=tmp_path, replicas_dns=dns)
    router_paths = set(create_router_app(router_config).openapi()["paths"])
    for kind, name, paths in [
        ("StatefulSet", "radixcache", server_paths),
        ("Deployment", "radixcache-router", router_paths),
    ]:
        c = container(objects, kind, name)
        probes = [c[p] for p in ("startupProbe", "readinessProbe", "livenessProbe") if p in c]
        assert len(probes) >= 2
        for probe in probes:
            assert probe["httpGet"]["path"] in paths
            assert probe["httpGet"]["port"] in {p["name"] for p in c["ports"]}
    replica = container(objects, "StatefulSet", "radixcache")
    assert replica["readinessProbe"]["httpGet"]["path"] == "/ready"  # fails while draining
    assert replica["livenessProbe"]["httpGet"]["path"] == "/health"


def test_ports_agree_between_flags_containers_and_services(objects: list[Obj]) -> None:
    for kind, name, service in [
        ("StatefulSet", "radixcache", "radixcache-replicas"),
        ("Deployment", "radixcache-router", "radixcache"),
    ]:
        c = container(objects, kind, name)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        args = resolved_args(objects, c)
        assert int(flag(args, "port")) == ports["http"]
        svc = find(objects, "Service", service)
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports
        labels = find(objects, kind, name)["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items()
    args = resolved_args(objects, container(objects, "StatefulSet", "radixcache"))
    ports = {p["name"]: p["containerPort"] for p in container(objects, "StatefulSet", "radixcache")["ports"]}  # fmt: skip
    assert flag(args, "kv-events-endpoint").endswith(f":{ports['kv-events']}")
    assert flag(args, "kv-events-replay-endpoint").endswith(f":{ports['kv-replay']}")
    router_args = resolved_args(objects, container(objects, "Deployment", "radixcache-router"))
    assert int(flag(router_args, "replica-events-port")) == ports["kv-events"]
    assert int(flag(router_args, "replica-replay-port")) == ports["kv-replay"]


def test_the_drain_fits_in_the_grace_period(objects: list[Obj]) -> None:
    spec = pod_spec(objects, "StatefulSet", "radixcache")
    c = spec["containers"][0]
    drain_s = float(flag(resolved_args(objects, c), "drain-timeout"))
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain_s + CLOSE_GRACE_S


def test_the_router_resolves_the_headless_service_of_the_replicas(objects: list[Obj]) -> None:
    args = resolved_args(objects, container(objects, "Deployment", "radixcache-router"))
    host, port = flag(args, "replicas-dns").rsplit(":", 1)
    svc = find(objects, "Service", host.split(".")[0])
    assert svc["spec"]["clusterIP"] == "None"  # one record per pod, not a virtual IP
    assert int(port) in {p["port"] for p in svc["spec"]["ports"] if p["name"] == "http"}
    sts = find(objects, "StatefulSet", "radixcache")
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]


def test_budget_and_autoscaler_target_the_replicas(objects: list[Obj], server: Any) -> None:
    labels = find(objects, "StatefulSet", "radixcache")["spec"]["template"]["metadata"]["labels"]
    pdb = find(objects, "PodDisruptionBudget", "radixcache")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = find(objects, "HorizontalPodAutoscaler", "radixcache")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "radixcache"
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    exported = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert re.search(rf"^{metric}(\{{| )", exported, re.M), metric


def test_gpu_variant_asks_for_a_gpu_and_cpu_does_not() -> None:
    for variant, wants in [("cpu", False), ("gpu", True)]:
        objects = load_kustomization(VARIANTS[variant])
        limits = container(objects, "StatefulSet", "radixcache")["resources"]["limits"]
        assert ("nvidia.com/gpu" in limits) == wants


def test_the_image_installs_exactly_the_lock_as_a_non_root_user() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^RUN make install\b", text, re.M)
    assert "requirements.lock" in text
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1] not in ("root", "0")
    objects = load_kustomization(BASE)
    run_as = pod_spec(objects, "StatefulSet", "radixcache")["securityContext"]["runAsUser"]
    assert user[-1] == str(run_as)
