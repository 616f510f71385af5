// Package shim is berthd's side of the per-pod berth-shim: the wire types of
// its API (net/rpc's wire format, wire.go), the client, the detached start, and readers for the
// records the shim leaves on disk (so a pod whose shim died still reports
// what happened); and the exchange between the shim and
// berth-shim-helper (ops.go). It uses the standard library only, so that
// importing it drags libcontainer neither into berthd nor into the shim; the
// shim's own logic is in package server, berth-shim-helper's in package ops.
//
// Pod folder layout (POD_DIR, e.g. /run/berth/pods/<podID>):
//
//	shim.sock                  the API (0600)
//	shim.pid                   the shim's pid
//	shim.log                   the shim's own stdout/stderr, and berth-shim-helper's stderr
//	lc/                        libcontainer state root
//	containers/<id>/config.json  OCI spec, written by the manager before Create
//	containers/<id>/started.json {"pid","startedAt"}, written durably on Start
//	containers/<id>/exit.json    {"exitCode","finishedAt",...}, written durably on exit
package shim
