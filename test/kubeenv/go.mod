module github.com/berth-runtime/berth/test/kubeenv

// The standard library only: test/kubelet and test/cluster pin different
// Kubernetes releases (and gRPC, x/sys), and a requirement here would raise
// theirs. What needs those (the CRI client) stays in each tier.
go 1.26.0
