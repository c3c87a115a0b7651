#!/usr/bin/env bash
# Runs the Java client example built by build.sh:
#   clients/java/run.sh -addr 127.0.0.1:50051 -tenant acme -user alice [-n 200] [-token T]
# The command line it runs is
#   java -cp clients/java/build/classes:<SIDECAR_RUN_JARS from classpath.sh> Example ARGS...
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=${BUILD_DIR:-$HERE/build}
# shellcheck source=classpath.sh
source "$HERE/classpath.sh"
CP=$(sidecar_classpath "${SIDECAR_RUN_JARS[@]}")
[[ -f "$BUILD/classes/Example.class" ]] || { echo "java client: not built; run clients/java/build.sh" >&2; exit 3; }
exec java ${JAVA_OPTS:--XX:+UseSerialGC -Xss512k} -cp "$BUILD/classes:$CP" Example "$@"
