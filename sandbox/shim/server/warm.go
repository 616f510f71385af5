package server

import (
	"encoding/json"
	"log"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
)

// warm does, while berthd still makes the pod's namespaces, network and
// files, work that libcontainer otherwise does once per process on the
// pod's first CreateContainer: finding the cgroup v1 hierarchies (a parse
// of the node's mountinfo, long on a node with many mounts) and building
// encoding/json's encoders for its state file (a walk of every type of its
// container config). Both are cached for the life of the process, and
// nothing that the first container would not build: the OCI spec is only
// decoded, field by field as its JSON has them. Nothing is created; a
// failure only means that the first container pays.
func (s *Server) warm() {
	cg := &cgroups.Cgroup{Path: "/", Resources: &cgroups.Resources{}}
	if _, err := manager.New(cg); err != nil {
		log.Printf("warm up: cgroup manager: %v", err)
	}
	json.Marshal(&libcontainer.State{})
	s.trimSoon()
}
