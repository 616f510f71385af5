// Package unpack extracts an image layer (an uncompressed tar stream) into one
// snapshot folder without ever writing outside it, turning OCI whiteouts into
// overlayfs whiteouts.
package unpack
