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
 * Plain C with no Go runtime: one thread, nothing allocated. Built static
 * (make build): it runs alone in an empty rootfs.
 */
#include <signal.h>
#include <stdio.h>
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
