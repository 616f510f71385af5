//go:build !crashpoints

package crashpoint

// Hit marks a crash point; in a normal build it is nothing.
func Hit(string) {}
