// Package crashpoint marks the steps of berthd's operations where a crash
// leaves the most half-done work, so that a test can kill berthd at each of
// them and check that a restart and the kubelet's retries clean everything
// up (test/integration/crash_test.go).
//
// The points do nothing unless berthd is built with the crashpoints build
// tag, which only the tests' build sets. Then two environment variables,
// read once at start, drive them:
//
//	BERTH_CRASHPOINT      the name of a point: berthd SIGKILLs itself the
//	                      first time it reaches it
//	BERTH_CRASHPOINT_LOG  a file each point reached appends its name to, so
//	                      that a test learns the points of an operation
//
// A name says where: the operation, then the step just done ("run pod:
// namespaces"). Names are fixed strings: no IDs, so that one run's list
// names the same points in the next run.
package crashpoint
