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
