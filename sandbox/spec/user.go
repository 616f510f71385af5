package spec

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ResolveUser returns the uid, gid and supplementary gids the container runs
// with.
//
// The CRI security context wins over the image: run_as_username, else
// run_as_user, each with run_as_group as the primary group when set
// (run_as_group alone is an error). Without either the image's User is used
// ("", "1002", "www-data", "1003:1004", "www-data:staff"; "" is root).
//
// Names are looked up in the rootfs's /etc/passwd and /etc/group, read as the
// container would see them: symlinks are resolved inside rootfs and can never
// reach a file outside it. A name that is not found is an error; a numeric
// uid needs no /etc/passwd (its gid is then 0 unless given).
//
// The primary gid comes from /etc/passwd unless a group is given. The
// supplementary gids are the primary gid, then the gids of the groups in
// /etc/group that list the user (skipped with the Strict supplemental groups
// policy), then the CRI supplemental_groups, without duplicates.
func ResolveUser(rootfs string, image ocispec.ImageConfig, sc *runtimeapi.LinuxContainerSecurityContext) (specs.User, error) {
	userPart, groupPart, err := userString(image.User, sc)
	if err != nil {
		return specs.User{}, err
	}
	var (
		u        specs.User
		username string
	)
	if uid, ok := parseID(userPart); ok {
		u.UID = uid
		pw, err := findPasswd(rootfs, func(e passwdEntry) bool { return e.uid == uid })
		if err != nil && !errors.Is(err, errNotFound) {
			return specs.User{}, err
		}
		if err == nil {
			u.GID, username = pw.gid, pw.name
		}
	} else {
		pw, err := findPasswd(rootfs, func(e passwdEntry) bool { return e.name == userPart })
		if err != nil {
			if errors.Is(err, errNotFound) {
				return specs.User{}, fmt.Errorf("user %q not found in the image's /etc/passwd", userPart)
			}
			return specs.User{}, err
		}
		u.UID, u.GID, username = pw.uid, pw.gid, pw.name
	}
	if groupPart != "" {
		if gid, ok := parseID(groupPart); ok {
			u.GID = gid
		} else {
			g, err := findGroup(rootfs, func(e groupEntry) bool { return e.name == groupPart })
			if err != nil {
				if errors.Is(err, errNotFound) {
					return specs.User{}, fmt.Errorf("group %q not found in the image's /etc/group", groupPart)
				}
				return specs.User{}, err
			}
			u.GID = g.gid
		}
	}

	gids := []uint32{u.GID}
	if username != "" && sc.GetSupplementalGroupsPolicy() != runtimeapi.SupplementalGroupsPolicy_Strict {
		groups, err := readGroups(rootfs)
		if err != nil && !errors.Is(err, errNotFound) {
			return specs.User{}, err
		}
		for _, g := range groups {
			if g.name == username {
				continue // the user's own group: only as its primary group
			}
			for _, member := range g.members {
				if member == username {
					gids = append(gids, g.gid)
					break
				}
			}
		}
	}
	for _, g := range sc.GetSupplementalGroups() {
		if g < 0 || g > math.MaxUint32 {
			return specs.User{}, fmt.Errorf("supplemental_groups: invalid gid %d", g)
		}
		gids = append(gids, uint32(g))
	}
	u.AdditionalGids = dedupe(gids)
	return u, nil
}

// userString returns the user and group parts ("" group: none given).
func userString(imageUser string, sc *runtimeapi.LinuxContainerSecurityContext) (string, string, error) {
	var group string
	if g := sc.GetRunAsGroup(); g != nil {
		if g.GetValue() < 0 || g.GetValue() > math.MaxUint32 {
			return "", "", fmt.Errorf("run_as_group: invalid gid %d", g.GetValue())
		}
		group = strconv.FormatInt(g.GetValue(), 10)
	}
	switch {
	case sc.GetRunAsUsername() != "":
		return sc.GetRunAsUsername(), group, nil
	case sc.GetRunAsUser() != nil:
		uid := sc.GetRunAsUser().GetValue()
		if uid < 0 || uid > math.MaxUint32 {
			return "", "", fmt.Errorf("run_as_user: invalid uid %d", uid)
		}
		return strconv.FormatInt(uid, 10), group, nil
	case group != "":
		return "", "", fmt.Errorf("run_as_group %s is set without run_as_user or run_as_username", group)
	}
	user, group, hasGroup := strings.Cut(imageUser, ":")
	if hasGroup && (user == "" || group == "") {
		return "", "", fmt.Errorf("image user %q: invalid user[:group]", imageUser)
	}
	if user == "" {
		user = "0"
	}
	return user, group, nil
}

func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

func dedupe(ids []uint32) []uint32 {
	seen := make(map[uint32]bool, len(ids))
	out := ids[:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

var errNotFound = errors.New("not found")

type passwdEntry struct {
	name     string
	uid, gid uint32
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// findPasswd returns the first /etc/passwd entry that matches; errNotFound
// (wrapped) when the file or the entry is missing.
func findPasswd(rootfs string, match func(passwdEntry) bool) (passwdEntry, error) {
	data, err := readRootFile(rootfs, "/etc/passwd")
	if err != nil {
		return passwdEntry{}, err
	}
	for _, f := range colonLines(data) {
		if len(f) < 4 {
			continue
		}
		uid, ok1 := parseID(f[2])
		gid, ok2 := parseID(f[3])
		if !ok1 || !ok2 {
			continue
		}
		if e := (passwdEntry{name: f[0], uid: uid, gid: gid}); match(e) {
			return e, nil
		}
	}
	return passwdEntry{}, errNotFound
}

// readGroups parses /etc/group; errNotFound when it is missing.
func readGroups(rootfs string) ([]groupEntry, error) {
	data, err := readRootFile(rootfs, "/etc/group")
	if err != nil {
		return nil, err
	}
	var groups []groupEntry
	for _, f := range colonLines(data) {
		if len(f) < 3 {
			continue
		}
		gid, ok := parseID(f[2])
		if !ok {
			continue
		}
		g := groupEntry{name: f[0], gid: gid}
		if len(f) > 3 && f[3] != "" {
			for _, m := range strings.Split(f[3], ",") {
				if m = strings.TrimSpace(m); m != "" {
					g.members = append(g.members, m)
				}
			}
		}
		groups = append(groups, g)
	}
	return groups, nil
}

func findGroup(rootfs string, match func(groupEntry) bool) (groupEntry, error) {
	groups, err := readGroups(rootfs)
	if err != nil {
		return groupEntry{}, err
	}
	for _, g := range groups {
		if match(g) {
			return g, nil
		}
	}
	return groupEntry{}, errNotFound
}

// colonLines splits a passwd/group style file into the fields of its
// meaningful lines (no blanks, comments or NIS "+"/"-" entries).
func colonLines(data []byte) [][]string {
	var out [][]string
	s := bufio.NewScanner(bytes.NewReader(data))
	s.Buffer(make([]byte, 0, 4096), len(data)+1)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || line[0] == '#' || line[0] == '+' || line[0] == '-' {
			continue
		}
		f := strings.Split(line, ":")
		if f[0] == "" {
			continue
		}
		out = append(out, f)
	}
	return out
}
