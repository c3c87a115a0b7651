#!/usr/bin/env bash
# Builds the Go client of the Context Sidecar, offline, from Debian's packages
# (clients/install-toolchains.sh go): protoc + protoc-gen-go + protoc-gen-go-grpc generate the stubs
# into clients/go/gen/contextsidecarv1 (not committed: regenerated whenever the proto changes), and
# `go build` in GOPATH mode (GO111MODULE=off, GOPATH=<ours>:/usr/share/gocode) links the library
# (package contextsidecar, this folder), the example and the load generator against Debian's
# grpc-go 1.33 / golang-protobuf 1.5 sources.
#
#   clients/go/build.sh            -> clients/go/build/bin/{sidecar-example,sidecar-loadgen}
#   clients/go/build.sh test ARGS  -> builds, then `go test ARGS ./...` over the library, the example
#                                     and the load generator (SIDECAR_ADDR=host:port runs the live
#                                     tests against that sidecar; without it they skip)
#   BUILD_DIR=/some/dir clients/go/build.sh
#
# Incremental: when the proto, the Go sources, this script and the tool versions are unchanged since
# the last successful build (build/.stamp), the build step exits at once.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${BUILD_DIR:-$HERE/build}
PROTO_DIR=$ROOT/proto
PROTO=context_sidecar/v1/context_service.proto
MODULE=contextsidecar                 # the proto's go_package is contextsidecar/gen/contextsidecarv1
GOPATH_DIR=$BUILD/gopath
PKG_DIR=$GOPATH_DIR/src/$MODULE       # a symlink to this folder: import "contextsidecar"
GEN=$HERE/gen/contextsidecarv1
BIN=$BUILD/bin

for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "go client: '$tool' not found; run clients/install-toolchains.sh go" >&2; exit 3; }
done
GOCODE=/usr/share/gocode/src
for dir in google.golang.org/grpc google.golang.org/grpc/health/grpc_health_v1 google.golang.org/protobuf/proto \
           google.golang.org/protobuf/encoding/protojson github.com/golang/protobuf/proto; do
  [[ -d $GOCODE/$dir ]] || {
    echo "go client: $GOCODE/$dir is missing; run clients/install-toolchains.sh go" >&2; exit 3; }
done
# golang-github-golang-protobuf-1-3-dev has no registry.go; with it the client compiles but panics
# on its first call ("protobuf tag not enough fields").
[[ -f $GOCODE/github.com/golang/protobuf/proto/registry.go ]] || {
  echo "go client: $GOCODE/github.com/golang/protobuf is the 1.3 library; install" \
    "golang-github-golang-protobuf-1-5-dev (clients/install-toolchains.sh go)" >&2; exit 3; }

export GO111MODULE=off
export GOPATH="$GOPATH_DIR:/usr/share/gocode"
export GOCACHE=${GOCACHE:-$BUILD/gocache}
export GOFLAGS=
export CGO_ENABLED=0

sources() {  # every hand-written Go file, the module file and this script, in a stable order
  (cd "$HERE" && find . \( -path ./build -o -path ./gen \) -prune -o \( -name '*.go' -o -name go.mod \) -print | LC_ALL=C sort)
}
stamp_of() {
  {
    sha256sum "$PROTO_DIR/$PROTO" "$HERE/build.sh"
    (cd "$HERE" && sources | xargs sha256sum)
    go version; protoc --version
    dpkg-query -W -f='${Package} ${Version}\n' golang-google-grpc-dev \
      golang-github-golang-protobuf-1-5-dev golang-google-protobuf-dev protoc-gen-go protoc-gen-go-grpc 2>/dev/null || true
  } | sha256sum | cut -d' ' -f1
}

build() {
  local want
  want=$(stamp_of)
  if [[ -x "$BIN/sidecar-example" && -x "$BIN/sidecar-loadgen" && -f "$GEN/context_service.pb.go" && -L "$PKG_DIR" \
        && -f "$BUILD/.stamp" && "$(cat "$BUILD/.stamp")" == "$want" ]]; then
    echo "go client: up to date ($BIN)"
    return 0
  fi
  mkdir -p "$BIN" "$GOCACHE" "$GOPATH_DIR/src"
  rm -f "$BUILD/.stamp"

  # 1. Stubs, from the proto as it is now. module=contextsidecar strips the go_package's module
  #    prefix, so contextsidecar/gen/contextsidecarv1 lands in ./gen/contextsidecarv1.
  rm -rf "$GEN"
  protoc -I "$PROTO_DIR" \
    --go_out="$HERE" --go_opt=module=$MODULE \
    --go-grpc_out="$HERE" --go-grpc_opt=module=$MODULE \
    "$PROTO_DIR/$PROTO"
  [[ -f "$GEN/context_service.pb.go" && -f "$GEN/context_service_grpc.pb.go" ]] || {
    echo "go client: protoc did not write the stubs under $GEN" >&2; exit 1; }

  # 2. GOPATH mode: $GOPATH/src/contextsidecar is this folder, so `import "contextsidecar"` and
  #    "contextsidecar/gen/contextsidecarv1" resolve to it (module mode would need a replace
  #    directive and a stub module for every Debian package). Older builds had a real folder here.
  if [[ -e "$PKG_DIR" && ! -L "$PKG_DIR" ]]; then rm -rf "$PKG_DIR"; fi
  ln -sfn "$HERE" "$PKG_DIR"

  (cd "$PKG_DIR" && go vet ./...)
  go build -o "$BIN/sidecar-example.tmp" $MODULE/example
  go build -o "$BIN/sidecar-loadgen.tmp" $MODULE/cmd/loadgen
  mv -f "$BIN/sidecar-example.tmp" "$BIN/sidecar-example"
  mv -f "$BIN/sidecar-loadgen.tmp" "$BIN/sidecar-loadgen"
  echo "$want" > "$BUILD/.stamp"
  echo "go client: built $BIN/sidecar-example and $BIN/sidecar-loadgen"
}

build
if [[ "${1:-}" == test ]]; then
  shift
  # From inside GOPATH, so ./... are the import paths contextsidecar, contextsidecar/example, ...
  cd "$PKG_DIR"
  exec go test "$@" ./...
fi
