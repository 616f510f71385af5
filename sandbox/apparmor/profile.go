package apparmor

// defaultProfileText is berth's RuntimeDefault profile, in the shape of the
// container default other runtimes load: everything a process may do inside
// its namespaces is allowed; what reaches the host through /proc and /sys,
// mounting, and signals or ptrace across the container's edge are not.
// It needs no include file, so it loads without Debian's profile library.
const defaultProfileText = `# berth's RuntimeDefault AppArmor profile, written and loaded by berthd at start.
@{PROC}=/proc/

profile berth-default flags=(attach_disconnected,mediate_deleted) {
  network,
  capability,
  file,
  umount,

  # Signals and ptrace only within this profile; the unconfined host
  # (berth-shim, the kubelet) may signal in.
  signal (receive) peer=unconfined,
  signal (send,receive) peer=berth-default,
  ptrace (trace,read,tracedby,readby) peer=berth-default,

  deny mount,

  # /proc: no writes to its host-wide top-level files, to the files of
  # processes outside the container's PID view, or to sysctls other than
  # kernel/shm*; never sysrq-trigger or kcore.
  deny @{PROC}/* w,
  deny @{PROC}/{[^1-9],[^1-9][^0-9],[^1-9s][^0-9y][^0-9s],[^1-9][^0-9][^0-9][^0-9/]*}/** w,
  deny @{PROC}/sys/[^k]** w,
  deny @{PROC}/sys/kernel/{?,??,[^s][^h][^m]**} w,
  deny @{PROC}/sysrq-trigger rwklx,
  deny @{PROC}/kcore rwklx,

  # /sys: read-only but the cgroup tree; firmware and the security
  # filesystem not even readable.
  deny /sys/[^f]*/** wklx,
  deny /sys/f[^s]*/** wklx,
  deny /sys/fs/[^c]*/** wklx,
  deny /sys/fs/c[^g]*/** wklx,
  deny /sys/fs/cg[^r]*/** wklx,
  deny /sys/firmware/** rwklx,
  deny /sys/kernel/security/** rwklx,
}
`
