/*
 * berth-exec-init starts one exec'd process in a running container for the
 * pod's shim (docs/architecture.md, "Exec"), in place of libcontainer's
 * exec, whose Go init and the Go helper that drives it were two Go program
 * starts per exec. It is C for the reason berth-pause is: no runtime to
 * start, one thread (setns into a user or mount namespace needs one).
 *
 * The shim starts it from a sealed copy (a memfd that no one can write):
 * until the command's execve, /proc/PID/exe of the process inside the
 * container names this binary, and root in the container must not be able
 * to rewrite the host's copy through it (CVE-2019-5736). It also makes
 * itself non-dumpable first thing, so that no process of the container can
 * trace it or open its files while it still holds the host's privileges.
 *
 * Interface (sandbox/shim/server/execinit.go is the other side):
 *   fd 0-2  the command's stdio
 *   fd 3    a pidfd of the container's init: the namespaces to join
 *   fd 4    the report: nothing then EOF once the command runs; else an
 *           error message (and this process exits 127)
 *   fd 5    the settings, "key=value" records each ending in NUL (below)
 *
 * It joins the container's cgroups, sets the rlimits, oom_score_adj and
 * the AppArmor exec label while it is still the host's root and sees the
 * host's /proc, joins the container's namespaces, then forks: a process
 * joins a PID namespace only through fork. The child drops to the
 * container's user, groups and capabilities, sets no_new_privs, loads the
 * seccomp filter the container's own init loaded (saved at create:
 * sandbox/shim/ops/execinit.go) and execs the command. This process stays
 * outside the container's PID namespace, invisible to the container, waits
 * for the command and exits with its status (killed by signal N: 128+N),
 * so that the shim reaps the exec's status from its own child.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/keyctl.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#define FD_PIDFD 3
#define FD_REPORT 4
#define FD_CONFIG 5

#define NO_VALUE (-1L)
/*
 * PIDS_LIMIT_REPORT begins the report of a fork the kernel refused with
 * EAGAIN: the pids limit of the container's cgroup (or its pod's) is
 * reached. On cgroup v1 this process moved itself in, which the limit does
 * not stop, so its fork is the first step the limit refuses. The shim
 * knows the prefix (shim.PidsLimitReport) and answers the exec with it.
 */
#define PIDS_LIMIT_REPORT "pids limit: "

/* The settings, as the shim sends them. */
struct config {
	long uid, gid;
	gid_t *groups;
	int ngroups;
	uint64_t cap_bnd, cap_eff, cap_prm, cap_inh, cap_amb;
	int nnp;
	struct {
		int resource;
		struct rlimit lim;
	} rlimits[64];
	int nrlimits;
	const char *apparmor;
	const char *keyring;
	const char *cwd;
	long umask;
	long oom_score_adj;
	int tty;
	const char *seccomp;
	unsigned long seccomp_flags;
	const char **cgroups;
	int ncgroups;
	char **env; /* with room for HOME and the NULL */
	int nenv;
	char **args;
	int nargs;
};

static int report_fd = FD_REPORT;

/*
 * fail reports what went wrong on the report fd (in the child, its error
 * pipe) and exits. The message names the step, as libcontainer's errors do.
 */
__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(msg) - 1)
		n = sizeof(msg) - 1;
	if (n > 0 && write(report_fd, msg, n) < 0) {
		/* nowhere left to say it: the exit status does */
	}
	_exit(127);
}

static char *read_all(int fd, size_t *len)
{
	size_t cap = 16384, n = 0;
	char *buf = malloc(cap);

	for (;;) {
		ssize_t r;

		if (!buf)
			fail("settings: out of memory");
		if (n == cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			continue;
		}
		r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			fail("settings: read: %m");
		if (r == 0)
			break;
		n += r;
	}
	*len = n;
	return buf;
}

static long number(const char *key, const char *v)
{
	char *end;
	long n;

	errno = 0;
	n = strtol(v, &end, 0);
	if (errno || *v == '\0' || *end != '\0')
		fail("settings: %s: bad number %s", key, v);
	return n;
}

static uint64_t mask(const char *key, const char *v)
{
	char *end;
	unsigned long long n;

	errno = 0;
	n = strtoull(v, &end, 16);
	if (errno || *v == '\0' || *end != '\0')
		fail("settings: %s: bad mask %s", key, v);
	return n;
}

/* A limit: a number, or "max" for RLIM_INFINITY. */
static rlim_t limit(const char *v)
{
	char *end;
	unsigned long long n;

	if (strcmp(v, "max") == 0)
		return RLIM_INFINITY;
	errno = 0;
	n = strtoull(v, &end, 10);
	if (errno || *v == '\0' || *end != '\0')
		fail("settings: rlimit: bad limit %s", v);
	return n;
}

static void parse(struct config *c, char *buf, size_t len)
{
	char *p = buf, *end = buf + len;
	size_t i, n = 0;

	memset(c, 0, sizeof(*c));
	c->uid = c->gid = c->umask = c->oom_score_adj = NO_VALUE;
	if (len == 0 || buf[len - 1] != '\0')
		fail("settings: not NUL-terminated");
	/*
	 * Each list gets room for every record: a pod's environment has no
	 * bound (the kubelet adds seven variables per Service of the namespace).
	 */
	for (i = 0; i < len; i++)
		n += buf[i] == '\0';
	c->groups = calloc(n, sizeof(*c->groups));
	c->cgroups = calloc(n, sizeof(*c->cgroups));
	c->env = calloc(n + 2, sizeof(*c->env));
	c->args = calloc(n + 1, sizeof(*c->args));
	if (!c->groups || !c->cgroups || !c->env || !c->args)
		fail("settings: out of memory");
	while (p < end) {
		char *rec = p, *v = strchr(rec, '=');

		p += strlen(rec) + 1;
		if (!v)
			fail("settings: record without '=': %s", rec);
		*v++ = '\0';
		if (strcmp(rec, "arg") == 0) {
			c->args[c->nargs++] = v;
		} else if (strcmp(rec, "env") == 0) {
			c->env[c->nenv++] = v;
		} else if (strcmp(rec, "cgroup") == 0) {
			c->cgroups[c->ncgroups++] = v;
		} else if (strcmp(rec, "uid") == 0) {
			c->uid = number(rec, v);
		} else if (strcmp(rec, "gid") == 0) {
			c->gid = number(rec, v);
		} else if (strcmp(rec, "group") == 0) {
			c->groups[c->ngroups++] = number(rec, v);
		} else if (strcmp(rec, "cap_bnd") == 0) {
			c->cap_bnd = mask(rec, v);
		} else if (strcmp(rec, "cap_eff") == 0) {
			c->cap_eff = mask(rec, v);
		} else if (strcmp(rec, "cap_prm") == 0) {
			c->cap_prm = mask(rec, v);
		} else if (strcmp(rec, "cap_inh") == 0) {
			c->cap_inh = mask(rec, v);
		} else if (strcmp(rec, "cap_amb") == 0) {
			c->cap_amb = mask(rec, v);
		} else if (strcmp(rec, "nnp") == 0) {
			c->nnp = number(rec, v) != 0;
		} else if (strcmp(rec, "tty") == 0) {
			c->tty = number(rec, v) != 0;
		} else if (strcmp(rec, "rlimit") == 0) {
			/* "RESOURCE SOFT HARD" */
			char *soft = strchr(v, ' '), *hard = soft ? strchr(soft + 1, ' ') : NULL;

			if (!hard || c->nrlimits == 64)
				fail("settings: bad rlimit %s", v);
			*soft++ = '\0';
			*hard++ = '\0';
			c->rlimits[c->nrlimits].resource = number(rec, v);
			c->rlimits[c->nrlimits].lim.rlim_cur = limit(soft);
			c->rlimits[c->nrlimits].lim.rlim_max = limit(hard);
			c->nrlimits++;
		} else if (strcmp(rec, "apparmor") == 0) {
			c->apparmor = v;
		} else if (strcmp(rec, "keyring") == 0) {
			c->keyring = v;
		} else if (strcmp(rec, "cwd") == 0) {
			c->cwd = v;
		} else if (strcmp(rec, "umask") == 0) {
			c->umask = number(rec, v);
		} else if (strcmp(rec, "oom_score_adj") == 0) {
			c->oom_score_adj = number(rec, v);
		} else if (strcmp(rec, "seccomp") == 0) {
			c->seccomp = v;
		} else if (strcmp(rec, "seccomp_flags") == 0) {
			c->seccomp_flags = number(rec, v);
		} else {
			/* An unknown setting could be a confinement: refuse it. */
			fail("settings: unknown key %s", rec);
		}
	}
	if (c->nargs == 0)
		fail("exec: no command");
	if (c->uid < 0 || c->gid < 0)
		fail("settings: no uid or gid");
}

/* write_file writes s to path (a file of the host's /proc or cgroupfs). */
static void write_file(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);

	if (fd < 0)
		fail("open %s: %m", path);
	if (write(fd, s, strlen(s)) != (ssize_t)strlen(s))
		fail("write %s: %m", path);
	close(fd);
}

/*
 * host_steps are what must be done while this process is still the host's
 * root, in the host's mount namespace: what the container could subvert
 * from inside it (its /proc is the container's to mount over) or what needs
 * the host's privileges (raising a hard rlimit, lowering oom_score_adj). All
 * of it is inherited by the child through fork.
 */
static void host_steps(struct config *c)
{
	char buf[4096];
	int i;

	for (i = 0; i < c->ncgroups; i++) {
		snprintf(buf, sizeof(buf), "%s/cgroup.procs", c->cgroups[i]);
		write_file(buf, "0");
	}
	for (i = 0; i < c->nrlimits; i++)
		if (setrlimit(c->rlimits[i].resource, &c->rlimits[i].lim) < 0)
			fail("setrlimit %d: %m", c->rlimits[i].resource);
	if (c->oom_score_adj != NO_VALUE) {
		snprintf(buf, sizeof(buf), "%ld", c->oom_score_adj);
		write_file("/proc/self/oom_score_adj", buf);
	}
	if (c->apparmor && *c->apparmor) {
		/* The label is taken at the command's exec; fork keeps it. */
		int fd = open("/proc/thread-self/attr/apparmor/exec", O_WRONLY | O_CLOEXEC);

		if (fd < 0)
			fd = open("/proc/thread-self/attr/exec", O_WRONLY | O_CLOEXEC);
		if (fd < 0)
			fail("apparmor: open exec attr: %m");
		snprintf(buf, sizeof(buf), "exec %s", c->apparmor);
		if (write(fd, buf, strlen(buf)) != (ssize_t)strlen(buf))
			fail("apparmor: set exec profile %s: %m", c->apparmor);
		close(fd);
	}
}

/*
 * join enters every namespace of the container's init at once (setns with
 * a pidfd, Linux 5.8). Its user namespace only when it is not ours: setns
 * refuses re-entering one's own. The pidfd pins the process, so the pid
 * behind /proc/PID/ns/user below is checked to still be it.
 */
static void join(void)
{
	char path[64];
	struct stat self, target;
	int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP;
	int pid = -1;
	FILE *f;
	char line[256];

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", FD_PIDFD);
	f = fopen(path, "re");
	if (!f)
		fail("pidfd: %m");
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Pid: %d", &pid) == 1)
			break;
	fclose(f);
	if (pid <= 0)
		fail("pidfd: the container's init has exited");
	snprintf(path, sizeof(path), "/proc/%d/ns/user", pid);
	if (stat("/proc/self/ns/user", &self) < 0 || stat(path, &target) < 0)
		fail("user namespace: %m");
	if (syscall(SYS_pidfd_send_signal, FD_PIDFD, 0, NULL, 0) < 0)
		fail("pidfd: the container's init has exited");
	if (self.st_ino != target.st_ino || self.st_dev != target.st_dev)
		flags |= CLONE_NEWUSER;
	if (access("/proc/self/ns/time", F_OK) == 0)
		flags |= CLONE_NEWTIME;
	if (setns(FD_PIDFD, flags) < 0)
		fail("setns: %m");
}

static void set_caps(struct config *c)
{
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct data[2];
	int i;

	for (i = 0; i < 2; i++) {
		data[i].effective = c->cap_eff >> (32 * i);
		data[i].permitted = c->cap_prm >> (32 * i);
		data[i].inheritable = c->cap_inh >> (32 * i);
	}
	if (syscall(SYS_capset, &hdr, data) < 0)
		fail("capset: %m");
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
		fail("clear ambient capabilities: %m");
	for (i = 0; i < 64; i++)
		if ((c->cap_amb >> i) & 1)
			if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, i, 0, 0) < 0)
				fail("raise ambient capability %d: %m", i);
}

/* drop_bounding takes from the bounding set what the container lacks. */
static void drop_bounding(struct config *c, int last_cap)
{
	int i;

	for (i = 0; i <= last_cap; i++)
		if (!((c->cap_bnd >> i) & 1) && prctl(PR_CAPBSET_DROP, i, 0, 0, 0) < 0)
			fail("drop bounding capability %d: %m", i);
}

static void set_user(struct config *c)
{
	if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0)
		fail("keep capabilities: %m");
	if (setgroups(c->ngroups, c->groups) < 0)
		fail("setgroups: %m");
	if (setresgid(c->gid, c->gid, c->gid) < 0)
		fail("setgid %ld: %m", c->gid);
	if (setresuid(c->uid, c->uid, c->uid) < 0)
		fail("setuid %ld: %m", c->uid);
	if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) < 0)
		fail("clear keep capabilities: %m");
}

static void load_seccomp(struct sock_fprog *prog, unsigned long flags)
{
	long r;

	if (!prog->len)
		return;
	if (flags)
		r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, prog);
	else
		r = prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0);
	if (r < 0)
		fail("load seccomp filter: %m");
}

/* read_filter reads the saved filter (sock_filter instructions). */
static void read_filter(const char *path, struct sock_fprog *prog)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		fail("seccomp filter %s: %m", path);
	if (fstat(fd, &st) < 0 || st.st_size == 0 || st.st_size % sizeof(struct sock_filter) ||
	    st.st_size / sizeof(struct sock_filter) > BPF_MAXINSNS)
		fail("seccomp filter %s: bad size", path);
	prog->len = st.st_size / sizeof(struct sock_filter);
	prog->filter = malloc(st.st_size);
	if (!prog->filter || read(fd, prog->filter, st.st_size) != st.st_size)
		fail("seccomp filter %s: read: %m", path);
	close(fd);
}

/*
 * own_stdio gives the command's stdio to its user, so that it can open
 * /dev/stdout (its pipe, through /proc) as runc's exec'd processes can.
 * Not a terminal: the pty's slave is already the container's. A failure
 * (a user namespace that does not map the pipe's owner) leaves them as
 * they are, as runc does.
 */
static void own_stdio(struct config *c)
{
	int fd;

	for (fd = 0; fd < 3; fd++) {
		struct stat st;

		if (fstat(fd, &st) == 0 && !S_ISCHR(st.st_mode))
			if (fchown(fd, c->uid, c->gid) < 0) {
				/* as above: keep going */
			}
	}
}

/*
 * new_tty makes a pty inside the container (its devpts), gives the master
 * to the shim over fd 0 (a socket: the console socket) and makes the slave
 * the command's stdio and controlling terminal.
 */
static void new_tty(void)
{
	char name[64];
	struct msghdr msg = {0};
	struct iovec iov = {.iov_base = name};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct cmsghdr *cm;
	int master, slave, unlock = 0, sock = dup(0);

	if (sock < 0)
		fail("console socket: %m");
	master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (master < 0)
		fail("open /dev/ptmx: %m");
	if (ioctl(master, TIOCSPTLCK, &unlock) < 0)
		fail("unlock pty: %m");
	slave = ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY);
	if (slave < 0)
		fail("open pty slave: %m");
	if (ptsname_r(master, name, sizeof(name)) != 0)
		snprintf(name, sizeof(name), "pty");
	iov.iov_len = strlen(name);
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = u.buf;
	msg.msg_controllen = sizeof(u.buf);
	cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &master, sizeof(int));
	if (sendmsg(sock, &msg, 0) < 0)
		fail("send pty: %m");
	close(master);
	close(sock);
	if (setsid() < 0)
		fail("setsid: %m");
	if (ioctl(slave, TIOCSCTTY, 0) < 0)
		fail("set controlling terminal: %m");
	if (dup2(slave, 0) < 0 || dup2(slave, 1) < 0 || dup2(slave, 2) < 0)
		fail("pty stdio: %m");
	if (slave > 2)
		close(slave);
}

/*
 * exec_path runs the command, looked up in the PATH of its own environment
 * as libcontainer does (never /bin/sh for a file without a #! line).
 */
__attribute__((noreturn)) static void exec_path(struct config *c)
{
	const char *file = c->args[0], *path = NULL;
	char buf[4096];
	int i, denied = 0;

	if (strchr(file, '/')) {
		execve(file, c->args, c->env);
		fail("exec %s: %m", file);
	}
	for (i = 0; i < c->nenv; i++)
		if (strncmp(c->env[i], "PATH=", 5) == 0)
			path = c->env[i] + 5;
	while (path) {
		const char *colon = strchr(path, ':');
		size_t dirlen = colon ? (size_t)(colon - path) : strlen(path);

		if (dirlen == 0)
			snprintf(buf, sizeof(buf), "./%s", file);
		else
			snprintf(buf, sizeof(buf), "%.*s/%s", (int)dirlen, path, file);
		execve(buf, c->args, c->env);
		if (errno == EACCES)
			denied = 1;
		else if (errno != ENOENT && errno != ENOTDIR)
			fail("exec %s: %m", buf);
		path = colon ? colon + 1 : NULL;
	}
	if (denied)
		fail("exec %s: permission denied", file);
	fail("exec: \"%s\": executable file not found in $PATH", file);
}

/*
 * add_home gives the command HOME from the container's /etc/passwd when its
 * environment has none, as libcontainer does (none when the user has no
 * entry).
 */
static void add_home(struct config *c)
{
	static char home[4096 + 5];
	char line[4096];
	FILE *f;
	int i;

	for (i = 0; i < c->nenv; i++)
		if (strncmp(c->env[i], "HOME=", 5) == 0)
			return;
	f = fopen("/etc/passwd", "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *field[7], *p = line;
		int n;

		for (n = 0; n < 7 && p; n++)
			field[n] = strsep(&p, ":");
		if (n < 7 || strtol(field[2], NULL, 10) != c->uid || *field[2] == '\0')
			continue;
		field[5][strcspn(field[5], "\n")] = '\0';
		snprintf(home, sizeof(home), "HOME=%s", field[5]);
		c->env[c->nenv++] = home;
		c->env[c->nenv] = NULL;
		break;
	}
	fclose(f);
}

/* child is the exec'd process up to its execve, inside the container. */
__attribute__((noreturn)) static void child(struct config *c, struct sock_fprog *filter, int last_cap)
{
	int chdir_done = 0;

	/* Back to the node's huge page policy: the shim's is not the container's. */
	prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0);
	if (c->tty)
		new_tty();
	if (c->keyring && syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, c->keyring) < 0 && errno != ENOSYS)
		fail("join session keyring: %m");
	if (c->umask != NO_VALUE)
		umask(c->umask);
	if (!c->tty)
		own_stdio(c);
	add_home(c);
	/*
	 * As root first: a folder the user cannot reach but root can (runc's
	 * order); the other way round (root squashed on NFS) after the user.
	 */
	if (c->cwd && chdir(c->cwd) == 0)
		chdir_done = 1;
	else if (c->cwd && errno != EACCES && errno != EPERM)
		fail("chdir %s: %m", c->cwd);
	/*
	 * Without no_new_privs, loading a filter takes CAP_SYS_ADMIN: before
	 * the capabilities go (what follows must then be allowed by it, as for
	 * runc). With it, as late as can be.
	 */
	if (!c->nnp)
		load_seccomp(filter, c->seccomp_flags);
	drop_bounding(c, last_cap);
	set_user(c);
	set_caps(c);
	if (c->nnp && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		fail("no_new_privs: %m");
	if (c->cwd && !chdir_done && chdir(c->cwd) < 0)
		fail("chdir %s: %m", c->cwd);
	if (c->nnp)
		load_seccomp(filter, c->seccomp_flags);
	exec_path(c);
}

/* last_cap is the highest capability the kernel knows (host's /proc). */
static int last_cap(void)
{
	int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
	char buf[16] = {0};

	if (fd < 0 || read(fd, buf, sizeof(buf) - 1) <= 0)
		fail("cap_last_cap: %m");
	close(fd);
	return atoi(buf);
}

int main(void)
{
	struct config c;
	struct sock_fprog filter = {0};
	size_t len;
	char *buf;
	int errpipe[2], status, lc;
	pid_t pid;
	ssize_t n;
	char msg[1024];

	/* First: nothing in the container may trace or open this process. */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		fail("set non-dumpable: %m");
	prctl(PR_SET_NAME, "berth-exec", 0, 0, 0);
	fcntl(FD_PIDFD, F_SETFD, FD_CLOEXEC);
	fcntl(FD_REPORT, F_SETFD, FD_CLOEXEC);
	buf = read_all(FD_CONFIG, &len);
	close(FD_CONFIG);
	parse(&c, buf, len);
	if (c.seccomp)
		read_filter(c.seccomp, &filter);
	lc = last_cap();
	host_steps(&c);
	join();
	if (pipe2(errpipe, O_CLOEXEC) < 0)
		fail("pipe: %m");
	pid = fork();
	if (pid < 0 && errno == EAGAIN)
		fail(PIDS_LIMIT_REPORT "fork: %m");
	if (pid < 0)
		fail("fork: %m");
	if (pid == 0) {
		close(FD_REPORT);
		close(FD_PIDFD);
		close(errpipe[0]);
		report_fd = errpipe[1];
		child(&c, &filter, lc);
	}
	close(errpipe[1]);
	close(0);
	close(1);
	close(2);
	/* EOF: the command runs (the pipe closed at its exec); else its error. */
	do
		n = read(errpipe[0], msg, sizeof(msg));
	while (n < 0 && errno == EINTR);
	if (n > 0 && write(FD_REPORT, msg, n) < 0) {
		/* the shim is gone; the exit status still says it failed */
	}
	close(FD_REPORT);
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			_exit(127);
	/*
	 * Killed by signal N: 128+N, the exit code the shim reports for it. Not
	 * the signal itself: a core-dumping one could dump this process.
	 */
	if (WIFSIGNALED(status))
		_exit(128 + WTERMSIG(status));
	_exit(WEXITSTATUS(status));
}
