#!/usr/bin/env bash
# Builds the Go client example of the Context Sidecar, offline, from Debian's packages
# (clients/install-toolchains.sh go): protoc + protoc-gen-go + protoc-gen-go-grpc generate the stubs
# into a GOPATH-mode tree, and `go build` (GO111MODULE=off, GOPATH=<ours>:/usr/share/gocode) links
# them against Debian's grpc-go 1.33 / golang-protobuf 1.5 sources.
#
#   clients/go/build.sh            -> clients/go/build/bin/sidecar-example
#   BUILD_DIR=/some/dir clients/go/build.sh
#
# Incremental: when the proto, the example, this script and the tool versions are unchanged since
# the last successful build (build/.stamp), it exits at once.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${BUILD_DIR:-$HERE/build}
PROTO_DIR=$ROOT/proto
PROTO=context_sidecar/v1/context_service.proto
GOPATH_DIR=$BUILD/gopath
GEN=$GOPATH_DIR/src/contextsidecar/gen/contextsidecarv1
BIN=$BUILD/bin/sidecar-example

for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "go client: '$tool' not found; run clients/install-toolchains.sh go" >&2; exit 3; }
done
GOCODE=/usr/share/gocode/src
for dir in google.golang.org/grpc google.golang.org/protobuf/proto github.com/golang/protobuf/proto; do
  [[ -d $GOCODE/$dir ]] || {
    echo "go client: $GOCODE/$dir is missing; run clients/install-toolchains.sh go" >&2; exit 3; }
done
# golang-github-golang-protobuf-1-3-dev has no registry.go; with it the client compiles but panics
# on its first call ("protobuf tag not enough fields").
[[ -f $GOCODE/github.com/golang/protobuf/proto/registry.go ]] || {
  echo "go client: $GOCODE/github.com/golang/protobuf is the 1.3 library; install" \
    "golang-github-golang-protobuf-1-5-dev (clients/install-toolchains.sh go)" >&2; exit 3; }

stamp_of() {
  {
    sha256sum "$PROTO_DIR/$PROTO" "$HERE/example/main.go" "$HERE/build.sh"
    go version; protoc --version
    dpkg-query -W -f='${Package} ${Version}\n' golang-google-grpc-dev \
      golang-github-golang-protobuf-1-5-dev golang-google-protobuf-dev protoc-gen-go protoc-gen-go-grpc 2>/dev/null || true
  } | sha256sum | cut -d' ' -f1
}
want=$(stamp_of)
if [[ -x "$BIN" && -f "$BUILD/.stamp" && "$(cat "$BUILD/.stamp")" == "$want" ]]; then
  echo "go client: up to date ($BIN)"
  exit 0
fi

mkdir -p "$BUILD/bin" "$BUILD/gocache"
rm -f "$BUILD/.stamp"
# 1. Stubs. Without paths=source_relative the go_package ("contextsidecar/gen/contextsidecarv1")
#    decides the directory, so --go_out=GOPATH/src puts them where GOPATH-mode imports look.
rm -rf "$GEN"
mkdir -p "$GOPATH_DIR/src"
protoc -I "$PROTO_DIR" \
  --go_out="$GOPATH_DIR/src" \
  --go-grpc_out="$GOPATH_DIR/src" \
  "$PROTO_DIR/$PROTO"
[[ -f "$GEN/context_service.pb.go" && -f "$GEN/context_service_grpc.pb.go" ]] || {
  echo "go client: protoc did not write the stubs under $GEN" >&2; exit 1; }

# 2. The example, in GOPATH mode (module mode would need replace directives for every Debian
#    package). The example lives outside GOPATH; imports resolve through GOPATH.
export GO111MODULE=off
export GOPATH="$GOPATH_DIR:/usr/share/gocode"
export GOCACHE=${GOCACHE:-$BUILD/gocache}
export GOFLAGS=
export CGO_ENABLED=0
go build -o "$BIN.tmp" "$HERE/example/main.go"
mv -f "$BIN.tmp" "$BIN"
echo "$want" > "$BUILD/.stamp"
echo "go client: built $BIN"
