package image

import (
	"bytes"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"
)

// FuzzDecodeImageBlobs feeds one blob to every decoder a pull runs on what a
// registry sends: manifest, index and config. None may panic; a config
// accepted has one valid chain ID per layer.
func FuzzDecodeImageBlobs(f *testing.F) {
	const d1 = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	f.Add([]byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["`+d1+`"]},"config":{"Env":["A=b"]}}`), uint8(1))
	f.Add([]byte(`{"rootfs":{"type":"layers","diff_ids":["sha512:00","md5:x",""]}}`), uint8(3))
	f.Add([]byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","size":-1,"digest":"`+d1+`"},"layers":[]}`), uint8(0))
	f.Add([]byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","size":9223372036854775807,"digest":"`+d1+`","platform":{"os":"linux"}}]}`), uint8(0))
	f.Fuzz(func(t *testing.T, blob []byte, layers uint8) {
		_, _ = v1.ParseManifest(bytes.NewReader(blob))
		_, _ = v1.ParseIndexManifest(bytes.NewReader(blob))
		_, ids, err := decodeConfig(blob, int(layers))
		if err != nil {
			return
		}
		if len(ids) != int(layers) {
			t.Fatalf("%d chain IDs for %d layers", len(ids), layers)
		}
		for _, id := range ids {
			if err := digest.Digest(id).Validate(); err != nil {
				t.Fatalf("chain ID %q: %v", id, err)
			}
		}
	})
}
