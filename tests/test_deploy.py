"""The Kubernetes example (deploy/kubernetes) and the image (Dockerfile): the manifests match the
Kubernetes API schemas, checked offline against the schemas the kubernetes-validate wheel ships; the
pod, the image and the sidecar's own flags agree with each other; and what they rely on works: gRPC
over TLS, Prometheus metrics on a chosen address."""

from __future__ import annotations

import copy
import json
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path, PurePosixPath

import grpc
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kubernetes_validate.utils import latest_version, major_minor

from sidecar import demo
from sidecar.cli import build_parser, host_port, metrics_address
from sidecar.server import SERVICE_NAME
from tests.conftest import ROOT, free_port

DEPLOY = ROOT / "deploy" / "kubernetes"
# 1.29: the oldest release with native sidecars (restartPolicy: Always on an init container).
K8S_VERSIONS = ("1.29", major_minor(latest_version()))


def _load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _manifests() -> dict[str, dict]:
    """Every manifest under deploy/kubernetes by kind (one of each)."""
    docs = [doc for path in sorted(DEPLOY.rglob("*.yaml")) for doc in _load(path)]
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs), "one manifest of each kind expected"
    return by_kind


def _validate(path: Path, version: str) -> None:
    for doc in _load(path):
        # strict: unknown fields are errors too, as `kubectl apply --validate=strict` makes them
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.fixture
def no_network(monkeypatch):
    """Validation must not reach out for a schema: every way out of this process fails."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("network access during manifest validation")

    for name in ("getaddrinfo", "create_connection"):
        monkeypatch.setattr(socket, name, refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_schemas_come_from_the_installed_package(version):
    schema = files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}.0-local-strict"
    assert (schema / "deployment-apps-v1.json").is_file()
    assert (schema / "_definitions.json").is_file()


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_matches_the_kubernetes_schema(version, no_network):
    paths = sorted(DEPLOY.rglob("*.yaml"))
    assert {doc["kind"] for p in paths for doc in _load(p)} == {
        "Deployment", "PersistentVolumeClaim", "NetworkPolicy", "Secret"}
    for path in paths:
        _validate(path, version)


def _sidecar(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["initContainers"][0]


MUTATIONS: dict[str, Callable[[dict], None]] = {
    "misspelt field": lambda d: _sidecar(d).__setitem__("readinesProbe", _sidecar(d).pop("readinessProbe")),
    "port as a string": lambda d: _sidecar(d)["ports"][0].__setitem__("containerPort", "50051"),
    "named port in a gRPC probe": lambda d: _sidecar(d)["livenessProbe"]["grpc"].__setitem__("port", "grpc"),
    "container without a name": lambda d: _sidecar(d).pop("name"),
    "deployment without a selector": lambda d: d["spec"].pop("selector"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_broken_manifest_fails_validation(mutation, tmp_path, no_network):
    deployment = copy.deepcopy(_manifests()["Deployment"])
    MUTATIONS[mutation](deployment)
    broken = tmp_path / "deployment.yaml"
    broken.write_text(yaml.safe_dump(deployment))
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(broken, latest_version())


def _pod_spec() -> dict:
    return _manifests()["Deployment"]["spec"]["template"]["spec"]


def _sidecar_args() -> list[str]:
    sidecar = _sidecar(_manifests()["Deployment"])
    assert sidecar["command"][:3] == ["python", "-m", "sidecar"]
    return sidecar["command"][3:] + sidecar["args"]


def test_the_pod_wires_the_sidecar_to_its_probes_token_metrics_and_volume():
    m = _manifests()
    deployment, secret, pvc, policy = m["Deployment"], m["Secret"], m["PersistentVolumeClaim"], m["NetworkPolicy"]
    template, spec, sidecar = deployment["spec"]["template"], _pod_spec(), _sidecar(deployment)
    args = build_parser().parse_args(_sidecar_args())  # the sidecar's own parser takes every flag

    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: up before the agent, down after it
    host, grpc_port = host_port(args.listen, "--listen")
    assert host == "0.0.0.0"  # the kubelet's probes dial the pod's address
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports["grpc"] == grpc_port
    probes = {name: sidecar[name]["grpc"] for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert all(p["port"] == grpc_port for p in probes.values())
    assert probes["readinessProbe"]["service"] == SERVICE_NAME  # a name the health service answers for
    assert probes["livenessProbe"].get("service", "") == ""

    metrics_port = host_port(args.metrics_listen, "--metrics-listen")[1]
    annotations = template["metadata"]["annotations"]
    assert ports["metrics"] == metrics_port == int(annotations["prometheus.io/port"])
    assert annotations["prometheus.io/scrape"] == "true"

    for container in spec["initContainers"] + spec["containers"]:  # the agent sends the same token
        env = {e["name"]: e for e in container["env"]}
        ref = env["SIDECAR_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]

    mounts = {mount["mountPath"]: mount["name"] for mount in sidecar["volumeMounts"]}
    data = mounts[str(PurePosixPath(args.db).parent)]
    volume = next(v for v in spec["volumes"] if v["name"] == data)
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    # One pod per DuckDB file: a rolling update would start a second sidecar on the locked file.
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"] and deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"

    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
    for container in spec["initContainers"] + spec["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert container["resources"]["requests"] and container["resources"]["limits"]

    assert policy["spec"]["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == ["metrics"]


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments left out."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            steps.append((instruction.upper(), rest.strip()))
    return steps


def test_the_image_runs_as_a_non_root_user_and_serves_where_the_pod_expects():
    steps = _dockerfile()
    kinds = [instruction for instruction, _ in steps]
    user = [rest for instruction, rest in steps if instruction == "USER"][-1]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric uid (runAsNonRoot can only check those)"
    assert int(uid) == _pod_spec()["securityContext"]["runAsUser"]

    install = next(i for i, (instruction, rest) in enumerate(steps)
                   if instruction == "RUN" and "pip install --no-cache-dir ." in rest)
    assert install < kinds.index("USER")  # installed as root, run as the user

    volume = json.loads(next(rest for instruction, rest in steps if instruction == "VOLUME"))
    owned = next(i for i, (instruction, rest) in enumerate(steps) if instruction == "RUN" and f"chown {uid}" in rest)
    assert owned < kinds.index("VOLUME"), "the volume's directory must belong to the user before VOLUME"

    cmd = json.loads(next(rest for instruction, rest in steps if instruction == "CMD"))
    assert cmd[:3] == ["python", "-m", "sidecar"]
    image, pod = build_parser().parse_args(cmd[3:]), build_parser().parse_args(_sidecar_args())
    assert image.command == pod.command == "serve"
    assert image.listen == pod.listen and image.db == pod.db
    assert str(PurePosixPath(image.db).parent) in volume
    exposed = {int(p) for instruction, rest in steps if instruction == "EXPOSE" for p in rest.split()}
    assert {host_port(pod.listen, "--listen")[1], host_port(pod.metrics_listen, "--metrics-listen")[1]} <= exposed


@pytest.mark.parametrize(("argv", "env", "expected"), [
    ([], {}, None),
    ([], {"SIDECAR_METRICS_PORT": "9100"}, ("127.0.0.1", 9100)),
    ([], {"SIDECAR_METRICS_PORT": "9100", "SIDECAR_METRICS_LISTEN": "0.0.0.0:9464"}, ("0.0.0.0", 9464)),
    (["--metrics-port", "9200"], {"SIDECAR_METRICS_LISTEN": "0.0.0.0:9464"}, ("127.0.0.1", 9200)),
    (["--metrics-listen", "[::]:9300"], {"SIDECAR_METRICS_PORT": "9100"}, ("::", 9300)),
    (["--metrics-port", "0"], {"SIDECAR_METRICS_PORT": "9100"}, None),
])
def test_metrics_address_precedence(argv, env, expected, monkeypatch):
    """A flag beats the environment; SIDECAR_METRICS_LISTEN beats SIDECAR_METRICS_PORT."""
    for name in ("SIDECAR_METRICS_PORT", "SIDECAR_METRICS_LISTEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    at = metrics_address(build_parser().parse_args(["serve", *argv]))
    assert (None if at is None else (at.host, at.port)) == expected


def test_metrics_listen_serves_prometheus_where_asked(spawn, monkeypatch):
    port, env_port = free_port(), free_port()
    monkeypatch.setenv("SIDECAR_METRICS_PORT", str(env_port))  # the flag wins over it
    server = spawn("metrics.duckdb", extra=["--metrics-listen", f"127.0.0.1:{port}"])
    health_pb2_grpc.HealthStub(server.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    assert "sidecar_job_queue_depth" in body and "sidecar_index_entries" in body
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{env_port}/metrics", timeout=2)


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 and its key, made now: nothing is stored or fetched."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def test_tls_serves_secure_clients_and_refuses_plaintext(spawn, self_signed, capsys):
    cert, key = self_signed
    server = spawn("tls.duckdb", extra=["--tls-cert", str(cert), "--tls-key", str(key)])
    request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)

    with grpc.secure_channel(server.address, grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())) as ch:
        answer = health_pb2_grpc.HealthStub(ch).Check(request, timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    # the demo's whole scenario over TLS, trusting the certificate
    assert demo.main(["--address", server.address, "--tenant", "opspilot-tls", "--tls-ca", str(cert)]) == 0
    assert "-- knowledge_status: MATCHED" in capsys.readouterr().out

    with grpc.insecure_channel(server.address) as ch, pytest.raises(grpc.RpcError) as refused:
        health_pb2_grpc.HealthStub(ch).Check(request, timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
