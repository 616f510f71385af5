// Package sysctl is the kubelet's rule for naming a sysctl, in one place for
// the two that read a pod's sysctls: sandbox/spec, which puts them in a
// container's OCI spec, and sandbox/podns, which writes them in the pod's
// namespaces. A key comes in dotted form ("net.ipv4.conf.eth0/100.rp_filter",
// a '/' standing for a '.' inside one name) or in slash form
// ("net/ipv4/conf/eth0.100/rp_filter"); both name the same file under
// /proc/sys.
package sysctl

import (
	"errors"
	"strings"
)

// ErrMalformed is Path's refusal of a key that names no file under /proc/sys
// or one outside it. Callers wrap it with the key as the pod gave it.
var ErrMalformed = errors.New(`not a sysctl name (an empty, "." or ".." part, a space or a control character)`)

// Dotted returns key in the kubelet's dotted form. A key whose first
// separator is '/' is in slash form and is converted; any other is already
// dotted.
func Dotted(key string) string {
	if i := strings.IndexAny(key, "./"); i >= 0 && key[i] == '/' {
		return swapDots(key)
	}
	return key
}

// Path returns the file under /proc/sys that key, in either form, names. It
// refuses a path part that is empty, "." or ".." (a dotted part of "", "/"
// or "//"), which would climb out of the namespace's folder, and a space or
// a control character, which no sysctl's name holds.
func Path(key string) (string, error) {
	rel := swapDots(Dotted(key))
	if strings.ContainsFunc(rel, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return "", ErrMalformed
	}
	for part := range strings.SplitSeq(rel, "/") {
		if part == "" || part == "." || part == ".." {
			return "", ErrMalformed
		}
	}
	return "/proc/sys/" + rel, nil
}

// swapDots turns dots into slashes and slashes into dots: one form into the
// other, and the dotted form into the path.
func swapDots(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.':
			return '/'
		case '/':
			return '.'
		}
		return r
	}, s)
}

// Namespace is the namespace that holds a sysctl: only these can be set
// for one pod, any other key would change the whole node.
type Namespace string

const (
	Net      Namespace = "net"
	IPC      Namespace = "ipc"
	UTS      Namespace = "uts"
	NodeWide Namespace = ""
)

// ipcKeys are the IPC namespace's sysctls besides fs.mqueue.*: the list
// libcontainer takes in a container's spec, so that a pod is refused the
// others (kernel.shm_next_id) when it starts rather than in every
// CreateContainer after.
var ipcKeys = map[string]bool{
	"kernel.msgmax": true, "kernel.msgmnb": true, "kernel.msgmni": true, "kernel.sem": true,
	"kernel.shmall": true, "kernel.shmmax": true, "kernel.shmmni": true, "kernel.shm_rmid_forced": true,
}

// NamespaceOf says which namespace holds the sysctl named by dotted (a key
// in Dotted form).
func NamespaceOf(dotted string) Namespace {
	switch {
	case strings.HasPrefix(dotted, "net."):
		return Net
	case ipcKeys[dotted], strings.HasPrefix(dotted, "fs.mqueue."):
		return IPC
	case dotted == "kernel.hostname", dotted == "kernel.domainname":
		return UTS
	}
	return NodeWide
}
