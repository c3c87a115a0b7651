#!/usr/bin/env bash
# Builds the Java client library of the Context Sidecar and its example, offline, from Debian's
# packages (clients/install-toolchains.sh java; no Maven/Gradle, no Maven Central): protoc
# --java_out plus /usr/bin/grpc_java_plugin generate the stubs from the proto as it is now, javac
# compiles them, the library (src/main/java, package dev.contextsidecar.client) and
# src/Example.java against the jars in /usr/share/java (grpc-java 1.41, protobuf-java 3.21).
#
#   clients/java/build.sh   -> clients/java/build/classes                  (then run.sh / test.sh)
#                              clients/java/build/libs/context-sidecar-client-<version>.jar
#                              (stubs + library + the proto; <version> from pom.xml)
#   BUILD_DIR=/some/dir clients/java/build.sh
#
# pom.xml is for users' Maven builds; this script is what CI runs.
# Incremental: when the proto, the sources, pom.xml, these scripts and the tool versions are
# unchanged since the last successful build (build/.stamp), it exits at once.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${BUILD_DIR:-$HERE/build}
PROTO_DIR=$ROOT/proto
PROTO=context_sidecar/v1/context_service.proto
PLUGIN=${GRPC_JAVA_PLUGIN:-/usr/bin/grpc_java_plugin}
# shellcheck source=classpath.sh
source "$HERE/classpath.sh"

for tool in javac jar protoc; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "java client: '$tool' not found; run clients/install-toolchains.sh java" >&2; exit 3; }
done
[[ -x "$PLUGIN" ]] || { echo "java client: $PLUGIN not found; run clients/install-toolchains.sh java" >&2; exit 3; }
CP=$(sidecar_classpath "${SIDECAR_COMPILE_JARS[@]}")
sidecar_classpath "${SIDECAR_RUN_JARS[@]}" >/dev/null

# The project's own <version> (two-space indent: a child of <project>, not of a dependency).
VERSION=$(sed -n 's:^  <version>\([^<]*\)</version>.*:\1:p' "$HERE/pom.xml" | head -1)
[[ -n "$VERSION" ]] || { echo "java client: no <version> in $HERE/pom.xml" >&2; exit 1; }
JAR=$BUILD/libs/context-sidecar-client-$VERSION.jar

main_sources() { find "$HERE/src/main/java" "$HERE/src/Example.java" -name '*.java' | LC_ALL=C sort; }

stamp_of() {
  {
    sha256sum "$PROTO_DIR/$PROTO" $(main_sources) "$HERE/pom.xml" "$HERE/build.sh" "$HERE/classpath.sh"
    javac -version 2>&1; protoc --version
    dpkg-query -W -f='${Package} ${Version}\n' libgrpc-java protobuf-compiler-grpc-java-plugin \
      libprotobuf-java 2>/dev/null || true
  } | sha256sum | cut -d' ' -f1
}
want=$(stamp_of)
if [[ -f "$BUILD/classes/Example.class" && -f "$JAR" && -f "$BUILD/.stamp" && "$(cat "$BUILD/.stamp")" == "$want" ]]; then
  echo "java client: up to date ($BUILD/classes, $JAR)"
  exit 0
fi

rm -rf "$BUILD/gen" "$BUILD/classes" "$BUILD/libs" "$BUILD/.stamp"
mkdir -p "$BUILD/gen" "$BUILD/classes" "$BUILD/libs"
protoc -I "$PROTO_DIR" \
  --plugin=protoc-gen-grpc-java="$PLUGIN" \
  --java_out="$BUILD/gen" \
  --grpc-java_out="$BUILD/gen" \
  "$PROTO_DIR/$PROTO"
[[ -f "$BUILD/gen/dev/contextsidecar/v1/ContextServiceGrpc.java" ]] || {
  echo "java client: protoc did not write the stubs under $BUILD/gen" >&2; exit 1; }

{ find "$BUILD/gen" -name '*.java'; main_sources; } > "$BUILD/sources.txt"
# -nowarn/-Xlint:none: the generated code trips deprecation warnings that are not ours to fix.
javac -encoding UTF-8 --release 11 -nowarn -Xlint:none -J-XX:+UseSerialGC -J-XX:TieredStopAtLevel=1 \
  -cp "$CP" -d "$BUILD/classes" @"$BUILD/sources.txt"

# The library jar: the stubs and dev.contextsidecar.client (not the example), plus the proto.
jar --create --file "$JAR" -C "$BUILD/classes" dev -C "$PROTO_DIR" "$PROTO"
echo "$want" > "$BUILD/.stamp"
echo "java client: built $BUILD/classes and $JAR"
