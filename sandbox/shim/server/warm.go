package server

import (
	"encoding/json"
	"log"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// specShape has an object of each type berth's container specs carry, empty:
// decoding it builds encoding/json's field table of each of those types.
const specShape = `{"process":{"user":{},"capabilities":{},"rlimits":[{}]},"root":{},"mounts":[{}],
"linux":{"resources":{"devices":[{}],"memory":{},"cpu":{},"pids":{},"hugepageLimits":[{}]},
"namespaces":[{}],"uidMappings":[{}],"devices":[{}],"seccomp":{"syscalls":[{"args":[{}]}]}}}`

// warm does, while berthd still makes the pod's namespaces, network and
// files, work that libcontainer otherwise does once per process on the
// pod's first CreateContainer: finding the cgroup v1 hierarchies (a parse
// of the node's mountinfo, long on a node with many mounts) and building
// encoding/json's encoders for its state file (a walk of every type of its
// container config); and, for berth's own first read of a container's
// config.json, the field tables of the OCI spec's types (about 1 ms of CPU
// in a fresh process, 0.1 ms once built). All are cached for the life of the
// process, and nothing that the first container would not build: the OCI
// spec is only decoded, field by field as its JSON has them, so only the
// types berth's specs carry are warmed (specShape). Nothing is created; a
// failure only means that the first container pays.
func (s *Server) warm() {
	cg := &cgroups.Cgroup{Path: "/", Resources: &cgroups.Resources{}}
	if _, err := manager.New(cg); err != nil {
		log.Printf("warm up: cgroup manager: %v", err)
	}
	json.Marshal(&libcontainer.State{})
	var spec specs.Spec
	if err := json.Unmarshal([]byte(specShape), &spec); err != nil {
		log.Printf("warm up: OCI spec: %v", err)
	}
	s.trimSoon()
}
