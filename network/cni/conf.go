package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
)

// confExtensions are the file names a network configuration may have.
var confExtensions = []string{".conflist", ".conf", ".json"}

// netConf is a loaded network configuration.
type netConf struct {
	file string // where it was read from
	// list has every plugin inline in its Bytes (also those of a .conf
	// file, or from the network's plugin folder), so that Bytes alone is
	// enough to run DEL later.
	list *libcni.NetworkConfigList
}

// confFiles lists dir's network configuration files in lexical order.
// A missing folder has none.
func confFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir) // sorted by name
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if !slices.Contains(confExtensions, ext) || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() { // follows symlinks
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// loadConf loads the first network configuration in dir, in lexical order,
// and checks that it can run: a name, a cniVersion berth's libcni knows,
// at least one plugin, each found in binDirs. A first file that is broken
// is an error: berth never falls back to the next one, which would put
// pods on a network the operator did not choose.
func loadConf(dir string, binDirs []string) (*netConf, error) {
	files, err := confFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no network configuration in %s (a %s file)", dir, strings.Join(confExtensions, ", "))
	}
	file := files[0]
	list, err := parseConfFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := checkConf(list, binDirs); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &netConf{file: file, list: list}, nil
}

// parseConfFile reads a .conflist (a list of plugins) or a .conf/.json file
// (one plugin, or a list under a name that does not say so) and returns
// it as a list whose Bytes carry every plugin inline.
func parseConfFile(file string) (*libcni.NetworkConfigList, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	var list *libcni.NetworkConfigList
	if _, isList := top["plugins"]; isList || filepath.Ext(file) == ".conflist" {
		// Also adds the plugins of the network's own folder (CNI 1.1).
		list, err = libcni.NetworkConfFromFile(file)
	} else {
		list, err = confAsList(b)
	}
	if err != nil {
		return nil, err
	}
	return inline(list)
}

// confAsList makes a one-plugin .conf a list of that plugin, as
// libcni's deprecated ConfListFromConf did.
func confAsList(b []byte) (*libcni.NetworkConfigList, error) {
	conf, err := libcni.NetworkPluginConfFromBytes(b)
	if err != nil {
		return nil, err
	}
	list, err := json.Marshal(map[string]any{
		"name":       conf.Network.Name,
		"cniVersion": conf.Network.CNIVersion,
		"plugins":    []json.RawMessage{b},
	})
	if err != nil {
		return nil, err
	}
	return libcni.NetworkConfFromBytes(list)
}

// inline rebuilds list's Bytes with all its plugins in "plugins".
func inline(list *libcni.NetworkConfigList) (*libcni.NetworkConfigList, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(list.Bytes, &top); err != nil {
		return nil, err
	}
	plugins := make([]json.RawMessage, 0, len(list.Plugins))
	for _, p := range list.Plugins {
		plugins = append(plugins, p.Bytes)
	}
	raw, err := json.Marshal(plugins)
	if err != nil {
		return nil, err
	}
	top["plugins"] = raw
	top["cniVersion"], _ = json.Marshal(list.CNIVersion) // the one picked from cniVersions
	delete(top, "cniVersions")
	b, err := json.Marshal(top)
	if err != nil {
		return nil, err
	}
	return libcni.NetworkConfFromBytes(b)
}

func checkConf(list *libcni.NetworkConfigList, binDirs []string) error {
	if list.Name == "" {
		return errors.New(`no network "name"`)
	}
	if list.CNIVersion == "" {
		return errors.New(`no "cniVersion"`)
	}
	if _, _, _, err := version.ParseVersion(list.CNIVersion); err != nil {
		return fmt.Errorf("cniVersion: %w", err)
	}
	if gt, _ := version.GreaterThan(list.CNIVersion, version.Current()); gt {
		return fmt.Errorf("cniVersion %s is newer than berth's CNI library supports (%s)", list.CNIVersion, version.Current())
	}
	if len(list.Plugins) == 0 {
		return errors.New("no plugins")
	}
	for i, p := range list.Plugins {
		if p.Network.Type == "" {
			return fmt.Errorf("plugin %d has no \"type\"", i)
		}
		if _, err := invoke.FindInPath(p.Network.Type, binDirs); err != nil {
			return fmt.Errorf("plugin %q not found in %s", p.Network.Type, strings.Join(binDirs, ", "))
		}
	}
	return nil
}

// parseBytes reads a configuration list as kept in a pod record.
func parseBytes(b []byte) (*libcni.NetworkConfigList, error) {
	return libcni.NetworkConfFromBytes(b)
}
