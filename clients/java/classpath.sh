# Sourced by build.sh, run.sh and test.sh: the Debian jars (in /usr/share/java) the Java client needs.
# Compile: the generated stubs, the library (src/main/java) and Example.java only see the gRPC API,
# grpc-context (io.grpc.Deadline), stubs, protobuf and guava; geronimo-annotation-1.3-spec provides
# @javax.annotation.Generated, which Java 11+ no longer ships.
# Run: grpc-core + grpc-netty and netty's split jars (netty-all.jar is an empty shell in Debian),
# plus grpc-protobuf-lite and perfmark-api; each one was needed.
JAVA_SHARE=${JAVA_SHARE:-/usr/share/java}
SIDECAR_COMPILE_JARS=(grpc-api grpc-context grpc-stub grpc-protobuf protobuf guava geronimo-annotation-1.3-spec)
SIDECAR_RUN_JARS=("${SIDECAR_COMPILE_JARS[@]}" grpc-core grpc-netty grpc-protobuf-lite
  perfmark-api netty-common netty-buffer netty-transport netty-codec netty-codec-http
  netty-codec-http2 netty-handler netty-resolver)
# Tests (test.sh only): JUnit 4 from Debian's junit4 package, with the hamcrest it needs.
SIDECAR_TEST_JARS=(junit4 hamcrest)

sidecar_classpath() {  # sidecar_classpath JAR... -> "/usr/share/java/a.jar:..." ; fails naming a missing jar
  local cp="" j
  for j in "$@"; do
    if [[ ! -f "$JAVA_SHARE/$j.jar" ]]; then
      echo "java client: $JAVA_SHARE/$j.jar is missing; run clients/install-toolchains.sh java" >&2
      return 3
    fi
    cp+="${cp:+:}$JAVA_SHARE/$j.jar"
  done
  printf '%s\n' "$cp"
}
