"""The Java client library (clients/java, package dev.contextsidecar.client) against live sidecars.

clients/java/test.sh builds the library (build.sh: stubs generated from the proto as it is now,
javac against Debian's jars) and its JUnit 4 tests (Debian's junit4), then runs them all in one
JVM, one `PASS|FAIL|SKIP Class.method` line each. Here it runs against two `python -m sidecar
serve` subprocesses: the plain one of tests/test_clients.py (the `sidecar` fixture) and one started
with a token (the same _Sidecar, given SIDECAR_AUTH_TOKEN_FILE). Each Java test is one pytest case
below; a skipped Java test (a live sidecar it did not get) fails here.

The toolchain detection, the build lock and the loud skip (a failure with SIDECAR_REQUIRE_CLIENTS=1)
are tests/test_clients.py's, imported.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_clients import (  # noqa: F401 (sidecar is a fixture used by name)
    BUILD_TIMEOUT_S,
    CLIENTS,
    ROOT,
    _build,
    _missing_java,
    _Sidecar,
    _skip_loudly,
    sidecar,
)

pytestmark = pytest.mark.slow

JAVA = CLIENTS / "java"
AUTH_TOKEN = "java-client-test-token"

# Every test of clients/java/src/test/java; a test added there must be added here (checked below).
JAVA_TESTS = [
    "RetryPolicyTest.defaultsRetryOnlyUnavailableFourAttempts",
    "RetryPolicyTest.backoffGrowsExponentiallyAndCaps",
    "RetryPolicyTest.jitterStaysWithinItsBandAndVaries",
    "RetryPolicyTest.retryOnIsConfigurable",
    "RetryPolicyTest.badSettingsAreRejected",
    "OfflineClientTest.healthWaitGivesUpWithUnavailable",
    "OfflineClientTest.readIsRetriedWithExponentialBackoffUntilMaxAttempts",
    "OfflineClientTest.writeGetsOneKeyReusedByEveryRetry",
    "OfflineClientTest.explicitKeyIsKept",
    "OfflineClientTest.writeWithoutKeyIsNotRetried",
    "OfflineClientTest.retriesStopAtTheCallDeadline",
    "OfflineClientTest.tokenGoesOutAsAuthorizationBearer",
    "OfflineClientTest.readMethodsAreExactlyTheRpcsWithoutAnIdempotencyKey",
    "OfflineClientTest.everyRpcHasATypedMethod",
    "OfflineClientTest.healthMessagesEncodeAsTheProtoSays",
    "SidecarClientLiveTest.connectWaitsForServing",
    "SidecarClientLiveTest.memoryAddAndSearch",
    "SidecarClientLiveTest.knowledgeIngestWaitAndSearch",
    "SidecarClientLiveTest.runsStartCheckpointResume",
    "SidecarClientLiveTest.notFoundIsAStatusRuntimeExceptionAndNotRetried",
    "SidecarClientLiveTest.retriedAppendIsNotDuplicated",
    "SidecarClientLiveTest.writeWithoutKeyIsNotRetried",
    "SidecarClientLiveTest.eachLogicalWriteGetsItsOwnKey",
    "SidecarClientLiveTest.explicitKeyIsKeptAndDeduplicates",
    "SidecarClientLiveTest.readIsRetriedOnUnavailable",
    "SidecarClientLiveTest.deadlineExceededIsNotRetried",
    "SidecarClientLiveTest.turnHelperRunsAWholeTurn",
    "AuthLiveTest.tokenIsSentAsBearer",
    "AuthLiveTest.missingTokenIsUnauthenticatedAndNotRetried",
    "AuthLiveTest.wrongTokenIsUnauthenticated",
    "AuthLiveTest.tokenSupplierIsReadPerCall",
]

_LINE = re.compile(r"^(PASS|FAIL|SKIP) (\w+\.\w+)\b(.*)$")


def _missing_junit() -> list[str]:
    """The test jars (SIDECAR_TEST_JARS in clients/java/classpath.sh) that are absent."""
    probe = subprocess.run(
        ["bash", "-c", 'source "$1"; for j in "${SIDECAR_TEST_JARS[@]}"; do '
                       '[[ -f "$JAVA_SHARE/$j.jar" ]] || echo "$JAVA_SHARE/$j.jar"; done',
         "probe", str(JAVA / "classpath.sh")],
        capture_output=True, text=True, timeout=30,
    )
    if probe.returncode != 0:
        return [f"clients/java/classpath.sh failed: {probe.stderr.strip()}"]
    return [f"{jar} (Debian package junit4)" for jar in probe.stdout.split()]


@pytest.fixture(scope="module")
def java_toolchain(pytestconfig) -> None:
    missing = _missing_java()
    if not missing:
        missing = _missing_junit()
    if missing:
        _skip_loudly("Java", missing, pytestconfig)
    _build("java", pytestconfig)


@pytest.fixture(scope="module")
def auth_sidecar(tmp_path_factory) -> Iterator[_Sidecar]:
    """tests/test_clients.py's sidecar, serving with a token: _Sidecar blanks SIDECAR_AUTH_TOKEN but
    passes the rest of the environment, and the token file is the documented other way in."""
    workdir = tmp_path_factory.mktemp("java-auth")
    token_file = workdir / "token"
    token_file.write_text(AUTH_TOKEN + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SIDECAR_AUTH_TOKEN_FILE", str(token_file))
        running = _Sidecar(workdir)
    yield running
    running.stop()


class _Results:
    def __init__(self, proc: subprocess.CompletedProcess, logs: str) -> None:
        self.proc = proc
        self.logs = logs
        self.outcome: dict[str, tuple[str, str]] = {}
        lines = proc.stdout.splitlines()
        for i, line in enumerate(lines):
            m = _LINE.match(line)
            if m:
                detail = m.group(3)
                if m.group(1) == "FAIL":  # the indented stack trace follows
                    trace = []
                    for nxt in lines[i + 1:]:
                        if not nxt.startswith("    "):
                            break
                        trace.append(nxt)
                    detail += "\n" + "\n".join(trace[:40])
                self.outcome[m.group(2)] = (m.group(1), detail)
        self.summary = next((ln for ln in lines if ln.startswith("SUMMARY ")), "")

    def explain(self) -> str:
        return (f"clients/java/test.sh exited {self.proc.returncode}\n--- stdout ---\n{self.proc.stdout[-6000:]}\n"
                f"--- stderr ---\n{self.proc.stderr[-4000:]}\n{self.logs}")


@pytest.fixture(scope="module")
def java_results(java_toolchain, sidecar, auth_sidecar) -> _Results:  # noqa: F811
    cmd = ["bash", str(JAVA / "test.sh"), "-addr", sidecar.address,
           "-auth-addr", auth_sidecar.address, "-auth-token", AUTH_TOKEN]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"clients/java/test.sh ran over {BUILD_TIMEOUT_S} s:\n{e.stdout}\n{e.stderr}")
    logs = (f"--- sidecar log ---\n{sidecar.log_text()[-3000:]}\n"
            f"--- auth sidecar log ---\n{auth_sidecar.log_text()[-3000:]}")
    results = _Results(proc, logs)
    print(results.summary)
    assert results.summary, "test.sh printed no SUMMARY line\n" + results.explain()
    return results


@pytest.mark.parametrize("name", JAVA_TESTS)
def test_java_library(java_results: _Results, name: str) -> None:
    status, detail = java_results.outcome.get(name, ("MISSING", ""))
    assert status == "PASS", f"{name}: {status}{detail}\n" + (java_results.explain() if status != "FAIL" else
                                                             java_results.logs)


def test_java_suite_is_whole_and_green(java_results: _Results) -> None:
    """Every Java test is listed above (none runs unchecked), and the run as a whole passed."""
    ran = set(java_results.outcome)
    assert ran == set(JAVA_TESTS), (f"not in JAVA_TESTS: {sorted(ran - set(JAVA_TESTS))}; "
                                    f"did not run: {sorted(set(JAVA_TESTS) - ran)}")
    assert java_results.proc.returncode == 0, java_results.explain()


def test_java_library_jar(java_toolchain) -> None:
    """build.sh's jar is the library: stubs, client and the proto, without the example."""
    version = _pom()["version"]
    jar = JAVA / "build" / "libs" / f"context-sidecar-client-{version}.jar"
    assert jar.is_file(), f"{jar} was not built"
    names = set(zipfile.ZipFile(jar).namelist())
    for want in ("dev/contextsidecar/client/SidecarClient.class", "dev/contextsidecar/client/Turn.class",
                 "dev/contextsidecar/client/RetryPolicy.class", "dev/contextsidecar/v1/ContextServiceGrpc.class",
                 "context_sidecar/v1/context_service.proto"):
        assert want in names, f"{want} is not in {jar.name}"
    assert "Example.class" not in names


# ---- pom.xml: the coordinates users fetch, in step with Debian's jars and the code ---------------

_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def _pom() -> dict[str, str]:
    root = ET.parse(JAVA / "pom.xml").getroot()
    out = {k: root.findtext(f"m:{k}", namespaces=_NS) or "" for k in ("groupId", "artifactId", "version")}
    props = root.find("m:properties", _NS)
    assert props is not None, "pom.xml has no <properties>"
    for child in props:
        out[child.tag.split("}")[1]] = (child.text or "").strip()
    out["plugins"] = " ".join(p.findtext("m:artifactId", namespaces=_NS) or ""
                              for p in root.iterfind("m:build/m:plugins/m:plugin", _NS))
    out["dependencies"] = " ".join(d.findtext("m:artifactId", namespaces=_NS) or ""
                                   for d in root.iterfind("m:dependencies/m:dependency", _NS))
    return out


def _debian_upstream(package: str) -> str | None:
    """'1.41.3' for an installed '1.41.3+ds-1'; None when dpkg does not know it."""
    if shutil.which("dpkg-query") is None:
        return None
    q = subprocess.run(["dpkg-query", "-W", "-f=${Status}|${Version}", package], capture_output=True, text=True)
    if q.returncode != 0 or not q.stdout.startswith("install ok installed|"):
        return None
    version = q.stdout.split("|", 1)[1]
    version = version.split(":", 1)[-1]            # epoch
    return re.split(r"[+~-]", version, maxsplit=1)[0]  # Debian revision and repack suffixes


def test_pom_names_the_library_and_its_versions() -> None:
    pom = _pom()
    assert (pom["groupId"], pom["artifactId"]) == ("dev.contextsidecar", "context-sidecar-client")
    java_version = re.search(r'VERSION = "([^"]+)"',
                             (JAVA / "src/main/java/dev/contextsidecar/client/SidecarClient.java").read_text())
    assert java_version and java_version.group(1) == pom["version"], "SidecarClient.VERSION != pom.xml <version>"
    assert "protobuf-maven-plugin" in pom["plugins"], pom["plugins"]
    for dep in ("grpc-api", "grpc-stub", "grpc-protobuf", "protobuf-java", "grpc-netty-shaded", "junit"):
        assert dep in pom["dependencies"].split(), f"pom.xml lacks {dep}"


def test_pom_versions_match_debian(pytestconfig) -> None:
    pom = _pom()
    packages = {"grpc.version": "libgrpc-java", "protobuf.version": "libprotobuf-java", "junit.version": "junit4"}
    found = {prop: _debian_upstream(pkg) for prop, pkg in packages.items()}
    missing = [f"Debian package {packages[prop]}" for prop, v in found.items() if v is None]
    if missing:
        _skip_loudly("Java", missing, pytestconfig)
    for prop, debian in found.items():
        assert pom[prop] == debian, f"pom.xml {prop}={pom[prop]} but Debian's {packages[prop]} is {debian}"


def test_java_sources_are_where_the_pom_expects() -> None:
    """Maven's layout: the library under src/main/java, the tests under src/test/java."""
    lib = sorted(p.name for p in (JAVA / "src/main/java/dev/contextsidecar/client").glob("*.java"))
    assert {"SidecarClient.java", "Turn.java", "RetryPolicy.java"} <= set(lib), lib
    tests = {p.stem for p in (JAVA / "src/test/java/dev/contextsidecar/client").glob("*Test.java")}
    assert tests == {n.split(".")[0] for n in JAVA_TESTS}, tests
    assert Path(JAVA / "src/Example.java").is_file()
