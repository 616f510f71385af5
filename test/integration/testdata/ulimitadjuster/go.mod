// The protocol's sample ulimit-adjuster plugin, built by the NRI tests
// (TestNRIUlimitAdjuster): v0.4.0 is the last release of
// github.com/containerd/nri whose module carries the samples (later ones
// moved them to github.com/containerd/nri/plugins, which the module proxy
// does not serve). Pinned here, once.
module github.com/berth-runtime/berth/test/integration/testdata/ulimitadjuster

go 1.24

tool github.com/containerd/nri/plugins/ulimit-adjuster

require (
	github.com/containerd/containerd v1.6.9 // indirect
	github.com/containerd/nri v0.4.0 // indirect
	github.com/containerd/ttrpc v1.1.1-0.20220420014843-944ef4a40df3 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/protobuf v1.5.2 // indirect
	github.com/opencontainers/runtime-spec v1.0.3-0.20220825212826-86290f6a00fb // indirect
	github.com/sirupsen/logrus v1.8.1 // indirect
	golang.org/x/net v0.1.0 // indirect
	golang.org/x/sys v0.1.0 // indirect
	golang.org/x/text v0.4.0 // indirect
	google.golang.org/genproto v0.0.0-20220502173005-c8bf987b8c21 // indirect
	google.golang.org/grpc v1.47.0 // indirect
	google.golang.org/protobuf v1.28.1 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
	k8s.io/cri-api v0.25.3 // indirect
	sigs.k8s.io/yaml v1.3.0 // indirect
)
