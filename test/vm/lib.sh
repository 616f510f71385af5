# Sourced by test/vm/run.sh and test/cluster/vmnode/disk.sh: filling a VM's
# root folder, $root, with the host's programs.

# copy_host_file PATH: the host's file at the same path, symlinks resolved,
# plus the shared libraries it loads.
copy_host_file() {
	local f=$1 real lib
	real=$(readlink -f "$f")
	[[ -e $root$real ]] || install -D "$real" "$root$real"
	if [[ $f != "$real" && ! -e $root$f ]]; then
		mkdir -p "$root$(dirname "$f")"
		ln -s "$real" "$root$f"
	fi
	for lib in $(ldd "$real" 2>/dev/null | grep -o '/[^ ]*' || true); do
		[[ -e $root$lib ]] || install -D "$(readlink -f "$lib")" "$root$lib"
	done
}

# copy_systemd: Debian's systemd (deps.sh installs it on the host, where it
# need not run): the files of its packages, less documentation, and the
# libraries of its programs.
copy_systemd() {
	local f
	while IFS= read -r f; do
		[[ -L $f || -f $f ]] || continue
		case $f in /usr/share/doc/* | /usr/share/man/* | /usr/share/locale/* | /usr/share/zsh/* | /usr/share/bash-completion/*) continue ;; esac
		if [[ -L $f ]]; then
			[[ -e $root$f || -L $root$f ]] || { mkdir -p "$root$(dirname "$f")" && cp -P "$f" "$root$f"; }
		elif [[ $(head -c4 "$f" | od -An -c | tr -d ' ') == 177ELF ]]; then
			copy_host_file "$f"
		else
			[[ -e $root$f ]] || install -D -m "$(stat -c %a "$f")" "$f" "$root$f"
		fi
	done < <(dpkg -L systemd libsystemd-shared)
}

# add_busybox DIR: busybox-static as DIR/bin/busybox, and each of its applets
# where DIR has nothing of that name yet.
add_busybox() {
	local dir=$1 a
	cp /bin/busybox "$dir/bin/busybox"
	for a in $(/bin/busybox --list-full); do
		[[ -e $dir/$a || -L $dir/$a ]] || ln -s /bin/busybox "$dir/$a"
	done
}

# write_users: root and nobody, the users and groups a VM's root needs.
write_users() {
	cat >"$root/etc/passwd" <<'USERS'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
USERS
	cat >"$root/etc/group" <<'GROUPS'
root:x:0:
tty:x:5:
nogroup:x:65534:
GROUPS
}

# add_criu CACHE: Debian's criu, which deps.sh unpacked into CACHE/criu (the
# host cannot run it), with its libraries from there and from the host; and
# what it runs: Debian's tar (it saves a container's tmpfs mounts, its /dev,
# with GNU tar's options, which busybox's tar lacks) and iptables-restore
# with its extensions (it locks the pod's network while it dumps). Fails
# when deps.sh has not unpacked it.
add_criu() {
	local criu_dir=$1/criu/root f lib
	[[ -x $criu_dir/usr/sbin/criu ]] || return 1
	install -D "$criu_dir/usr/sbin/criu" "$root/usr/sbin/criu"
	rm -f "$root/bin/tar"
	for f in /bin/tar /usr/sbin/iptables-restore /usr/sbin/ip6tables-restore /usr/lib/x86_64-linux-gnu/xtables/*.so; do
		copy_host_file "$f"
	done
	for lib in $(LD_LIBRARY_PATH="$criu_dir/usr/lib/x86_64-linux-gnu" ldd "$criu_dir/usr/sbin/criu" | grep -o '/[^ ]*' || true); do
		[[ -e $root$lib ]] || install -D "$(readlink -f "$lib")" "$root${lib#"$criu_dir"}"
	done
}
