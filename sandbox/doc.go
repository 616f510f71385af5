// Package sandbox owns pod sandboxes and their containers: lifecycle, metadata,
// CRI → OCI runtime spec, the per-pod shim client and recovery after a restart.
package sandbox
