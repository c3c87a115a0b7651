#!/usr/bin/env bash
# Builds the library (build.sh) and its JUnit 4 tests (src/test/java, against Debian's junit4 and
# hamcrest jars), then runs them with dev.contextsidecar.client.TestMain, one line per test
# (PASS/FAIL/SKIP NAME ...) and a SUMMARY line; exits 1 when a test failed.
#
#   clients/java/test.sh [-addr HOST:PORT] [-auth-addr HOST:PORT -auth-token TOKEN] [TestClass ...]
#
#   -addr        a running sidecar without a token: SidecarClientLiveTest
#   -auth-addr   a running sidecar started with --auth-token TOKEN: AuthLiveTest
# Without them the live tests are skipped (SKIP lines); RetryPolicyTest and OfflineClientTest need
# no sidecar. tests/test_java_client.py starts both sidecars and runs this.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=${BUILD_DIR:-$HERE/build}
# shellcheck source=classpath.sh
source "$HERE/classpath.sh"

addr=""; auth_addr=""; auth_token=""; classes=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -addr) addr=${2:?-addr needs a value}; shift 2 ;;
    -auth-addr) auth_addr=${2:?-auth-addr needs a value}; shift 2 ;;
    -auth-token) auth_token=${2:?-auth-token needs a value}; shift 2 ;;
    -*) echo "test.sh: unknown flag $1" >&2; exit 2 ;;
    *) classes+=("$1"); shift ;;
  esac
done

TEST_CP=$(sidecar_classpath "${SIDECAR_TEST_JARS[@]}")
RUN_CP=$(sidecar_classpath "${SIDECAR_RUN_JARS[@]}")
mkdir -p "$BUILD"
(
  # The same lock file tests/test_clients.py takes around build.sh: one build at a time.
  flock 9
  bash "$HERE/build.sh" >&2
  want=$({ cat "$BUILD/.stamp"; find "$HERE/src/test/java" -name '*.java' | LC_ALL=C sort | xargs sha256sum;
           sha256sum "$HERE/test.sh"; echo "$TEST_CP"; } | sha256sum | cut -d' ' -f1)
  if [[ -f "$BUILD/.test-stamp" && "$(cat "$BUILD/.test-stamp")" == "$want" ]]; then
    echo "java client tests: up to date ($BUILD/test-classes)" >&2
  else
    rm -rf "$BUILD/test-classes" "$BUILD/.test-stamp"
    mkdir -p "$BUILD/test-classes"
    find "$HERE/src/test/java" -name '*.java' > "$BUILD/test-sources.txt"
    javac -encoding UTF-8 --release 11 -Xlint:all,-processing,-serial -J-XX:+UseSerialGC -J-XX:TieredStopAtLevel=1 \
      -cp "$BUILD/classes:$RUN_CP:$TEST_CP" -d "$BUILD/test-classes" @"$BUILD/test-sources.txt"
    echo "$want" > "$BUILD/.test-stamp"
    echo "java client tests: built $BUILD/test-classes" >&2
  fi
) 9>"$BUILD/.lock"

exec java ${JAVA_OPTS:--XX:+UseSerialGC -Xss512k} -cp "$BUILD/test-classes:$BUILD/classes:$RUN_CP:$TEST_CP" \
  -Dsidecar.addr="$addr" -Dsidecar.auth.addr="$auth_addr" -Dsidecar.auth.token="$auth_token" \
  dev.contextsidecar.client.TestMain "${classes[@]}"
