//go:build crashpoints

package lazyd

import (
	"os"
	"strconv"
)

func init() {
	if v, err := strconv.Atoi(os.Getenv(ProtocolVersionEnv)); err == nil {
		servedVersion = v
	}
}
