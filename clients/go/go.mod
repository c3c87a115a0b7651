// The Go client of the Context Sidecar: package contextsidecar (this folder), the stubs generated
// from proto/context_sidecar/v1/context_service.proto into gen/contextsidecarv1 by build.sh (not
// committed), the example and the load generator (cmd/loadgen). The offline build (build.sh) is in
// GOPATH mode against Debian's packages and ignores this file; in module mode, generate the stubs
// first (build.sh, or its protoc line) and point a replace directive here.
module contextsidecar

go 1.19

require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
