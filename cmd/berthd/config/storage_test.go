package config

import (
	"errors"
	"io"
	"strings"
	"testing"
)

func TestStorageContainerRoot(t *testing.T) {
	t.Run("default is root", func(t *testing.T) {
		c, err := FromArgs([]string{"--config", writeConfig(t, ""), "--root", "/flag/root"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ContainerRoot(); got != "/flag/root" {
			t.Errorf("container root = %q, want root as --root set it", got)
		}
	})
	t.Run("set", func(t *testing.T) {
		c, err := Load(writeConfig(t, "[storage]\ncontainer_root = \"/disk2/berth\""), true)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ContainerRoot(); got != "/disk2/berth" || c.Root != "/var/lib/berth" {
			t.Errorf("container root = %q, root = %q; want /disk2/berth and the default root", got, c.Root)
		}
	})
	t.Run("relative refused naming the key", func(t *testing.T) {
		_, err := Load(writeConfig(t, "[storage]\ncontainer_root = \"disk2/berth\""), true)
		var ke *KeyError
		if !errors.As(err, &ke) || ke.Key != "storage.container_root" || !strings.Contains(err.Error(), "absolute") {
			t.Errorf("err = %v, want a KeyError for storage.container_root saying absolute", err)
		}
	})
	t.Run("unknown key refused", func(t *testing.T) {
		_, err := Load(writeConfig(t, "[storage]\ncontainers_root = \"/x\""), true)
		if err == nil || !strings.Contains(err.Error(), `unknown key "storage.containers_root"`) {
			t.Errorf("err = %v, want the unknown key named", err)
		}
	})
}
