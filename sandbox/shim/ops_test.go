package shim

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestOpReplyWireNames: a shim that runs across an upgrade starts the new
// berth-shim-helper, so the JSON names of the exchange stay as they were
// when the Go names changed.
func TestOpReplyWireNames(t *testing.T) {
	b, err := json.Marshal(OpReply{DeleteByOp: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"DeleteByHelper":true`) {
		t.Fatalf("OpReply encodes as %s, want the field DeleteByHelper", b)
	}
}
