/*
 * berth-pause is PID 1 of a pod's shared PID namespace (see
 * docs/architecture.md, "Process model"). It only has to exist: it holds the
 * namespace, and the kernel reaps the orphans reparented to it because it
 * ignores SIGCHLD. It ignores every other signal as well: root in any
 * container of the pod can signal its PID 1, and its exit would end every
 * container of the pod. Only SIGKILL from outside the namespace (berthd
 * stopping the pod) ends it; the kernel never delivers SIGKILL or SIGSTOP to
 * a PID 1 from inside its own namespace.
 *
 * Root in a container of the pod may also trace its PID 1. berthd starts it
 * as an unprivileged user with no capabilities and no_new_privs (see
 * sandbox/pause.go), and it makes itself non-dumpable first thing: the
 * kernel sets a process dumpable again at every exec where its uid did not
 * change, so only the program itself can clear the flag. Non-dumpable, a
 * process with its uid but without CAP_SYS_PTRACE cannot attach to it or
 * read its memory or environment. (Before the prctl the pause is dumpable
 * for a few instructions; no container of the pod exists yet then.)
 *
 * Plain C with no Go runtime: one thread, nothing allocated. Built static
 * (make build): it runs alone in an empty rootfs.
 */
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/*
 * The kernel's struct sigaction (x86_64, arm64). rt_sigaction directly, not
 * sigaction(3): glibc refuses the two real-time signals it keeps for itself,
 * which would be left to their default action (terminate).
 */
struct ksigaction {
	void (*handler)(int);
	unsigned long flags;
	void (*restorer)(void);
	unsigned long mask;
};

int main(int argc, char **argv)
{
	struct ksigaction ign = {.handler = SIG_IGN};
	int sig;

	(void)argv;
	/* Fail closed: a pause that anyone with its uid could trace is not run. */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
		perror("berth-pause: prctl(PR_SET_DUMPABLE, 0)");
		return 1;
	}
	if (argc != 1) {
		fputs("usage: berth-pause (no arguments)\n", stderr);
		return 2;
	}
	/* SIGKILL and SIGSTOP fail with EINVAL: they cannot be ignored. */
	for (sig = 1; sig <= 64; sig++)
		syscall(SYS_rt_sigaction, sig, &ign, NULL, sizeof(ign.mask));
	for (;;)
		pause(); /* no handler is installed: it never returns */
}
