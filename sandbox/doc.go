// Package sandbox runs pod sandboxes and their containers: their lifecycle
// (each start a list of steps that register their undo), the per-pod shims,
// the pause, exec and streams, and recovery after a restart. The records
// live in sandbox/store, which the lifecycle asks and writes through;
// what pods and containers use is read by sandbox/stats.
package sandbox
