//go:build !cgo || noisal

package gunzip

import (
	"errors"
	"io"
)

// openISAL: static builds (the VM tier's, tag noisal) and builds without
// cgo cannot load a shared library.
func openISAL() error {
	return errors.New("berthd was built without ISA-L (without cgo, or with the noisal tag)")
}

// newISALReader is never called: openISAL failed.
func newISALReader(io.Reader) io.ReadCloser { panic("gunzip: built without ISA-L") }
