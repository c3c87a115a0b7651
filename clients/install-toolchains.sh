#!/usr/bin/env bash
# Installs, from Debian's packages only (no Go module proxy, no Maven Central), what the Go and
# Java client examples need: see DESIGN.md §7. Idempotent: packages already installed are skipped,
# and nothing is fetched when all are present. Run as root (CI images usually are).
#
#   clients/install-toolchains.sh          # both
#   clients/install-toolchains.sh go       # only Go
#   clients/install-toolchains.sh java     # only Java
set -euo pipefail

# Go 1.19, grpc-go 1.33.3, protoc 3.21. golang-github-golang-protobuf-1-5-dev must be named:
# without it apt picks the 1-3 library and the client panics on its first call
# ("protobuf tag not enough fields").
GO_PKGS=(golang-go golang-google-grpc-dev golang-github-golang-protobuf-1-5-dev
         golang-google-protobuf-dev protoc-gen-go protoc-gen-go-grpc protobuf-compiler)
# grpc-java 1.41, protobuf-java 3.21; junit4 (4.13, with hamcrest) for the library's tests
# (clients/java/test.sh). The JDK is added only when no javac is on PATH.
JAVA_PKGS=(libgrpc-java protobuf-compiler-grpc-java-plugin libprotobuf-java libnetty-java
           libperfmark-java libguava-java libgeronimo-annotation-1.3-spec-java protobuf-compiler junit4)

want=()
case "${1:-all}" in
  go) want=("${GO_PKGS[@]}") ;;
  java) want=("${JAVA_PKGS[@]}") ;;
  all) want=("${GO_PKGS[@]}" "${JAVA_PKGS[@]}") ;;
  *) echo "usage: $0 [go|java|all]" >&2; exit 2 ;;
esac
if [[ "${1:-all}" != go ]] && ! command -v javac >/dev/null 2>&1; then
  want+=(default-jdk-headless)
fi

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-toolchains: all ${#want[@]} packages already installed"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "install-toolchains: must run as root to install: ${missing[*]}" >&2; exit 1
  fi
else
  SUDO=
fi
echo "install-toolchains: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Refresh the lists only when a package is unknown to apt (fresh CI images ship without lists).
if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then
  $SUDO apt-get update -q
fi
$SUDO apt-get install -y --no-install-recommends "${missing[@]}"
