package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/test/kubeenv"
)

// The e2e suite's test images, built offline and served by the run's
// loopback registry under the names the suite asks for: e2e.test reads
// KUBE_TEST_REPO_LIST (test/utils/image/manifest.go), a YAML file that maps
// each registry it knows to another; every one it pulls from is mapped to
// the loopback registry, under the same paths (registry.k8s.io/e2e-test-images
// becomes 127.0.0.1:PORT/e2e-test-images). The invalid registry stays as it
// is (its specs expect the pull to fail) and so does the private one (its
// specs need the internet: conformance-skips.txt).
//
// The images are built as berth's other test images are: Debian's
// busybox-static for the commands, and programs of Debian packages with the
// shared libraries ldd names for them; agnhost and nnp are built from their
// source in the kubernetes module (make test-conformance).
//
// Upstream's images differ where the specs cannot tell. Where they can,
// these do as upstream's do. Upstream's busybox shell both keeps
// environment variables whose names are not identifiers (the ConfigMap and
// Secret "consumable via the environment" specs run `sh -c env`) and says
// "/bin/sh: can't create /file: ..." (the read-only root filesystem spec
// runs /bin/sh); Debian's busybox 1.35 drops such variables, and no shell
// of Debian's does both. So the sh that PATH finds first is Debian's
// bash-static, in /usr/bin, and /bin/sh is busybox's in the busybox-like
// images: the specs that run /bin/sh there get busybox's messages, those
// that run sh keep every variable. Debian's busybox shell runs its own
// applets before the programs PATH names (nc, without -u, before
// OpenBSD's), unlike upstream's Alpine one, so in agnhost's images, where
// the specs run /bin/sh -c "... | nc -u ...", /bin/sh is bash-static too.
// nc is OpenBSD's, which speaks UDP (`nc -u`); agnhost's images have curl.

// e2eRegistries are the registries of manifest.go's RegistryList mapped to
// the loopback registry: each one's YAML key and its path there.
var e2eRegistries = map[string]string{
	"promoterE2eRegistry":      "e2e-test-images",
	"buildImageRegistry":       "build-image",
	"gcEtcdRegistry":           "",
	"gcRegistry":               "",
	"sigStorageRegistry":       "sig-storage",
	"dockerLibraryRegistry":    "library",
	"cloudProviderGcpRegistry": "cloud-provider-gcp",
}

// e2eImagePackages are the Debian packages whose programs the images hold
// (make test-conformance installs them).
var e2eImagePackages = []string{"bash-static", "netcat-openbsd", "curl", "nginx-light", "hostname", "util-linux"}

// imageBase is what every test image holds: the busybox-static applets in
// /bin (sh and nc replaced, see above), users, groups, the name service
// switch and the usual folders.
type imageBase struct {
	entries []kubeenv.Entry
	seen    map[string]bool // the paths in entries
}

// pushE2EImages builds the suite's images, pushes them to the run's
// registry and writes the KUBE_TEST_REPO_LIST file, whose path it returns.
func (e *env) pushE2EImages(t *testing.T) string {
	t.Helper()
	k8sSrc := kubernetesModuleDir(t)
	pause := kubeenv.Process{Entrypoint: []string{"/agnhost", "pause"}}
	push := func(repoTag string, b *imageBase, p kubeenv.Process) {
		if p.Env == nil {
			p.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		}
		e.reg.PushImage(t, repoTag, b.entries, p)
	}

	busybox := newImageBase(t, busyboxSh, "", "")
	push("e2e-test-images/busybox:1.37.0-2", busybox, kubeenv.Process{Cmd: []string{"sh"}})

	nonroot := newImageBase(t, busyboxSh, "", "")
	push("e2e-test-images/nonroot:1.5", nonroot, kubeenv.Process{Cmd: []string{"sh"}, User: "1234"})

	nnp := newImageBase(t, busyboxSh, "", "")
	nnp.hostProgram(t, e.bin("nonewprivs"), "usr/local/bin/nnp")
	nnp.setuid("usr/local/bin/nnp")
	push("e2e-test-images/nonewprivs:1.4", nnp, kubeenv.Process{Cmd: []string{"nnp"}})

	ipc := newImageBase(t, busyboxSh, "", "")
	ipc.hostProgram(t, "/usr/bin/ipcmk", "usr/bin/ipcmk")
	ipc.hostProgram(t, "/usr/bin/ipcs", "usr/bin/ipcs")
	ipc.hostProgram(t, "/usr/bin/ipcrm", "usr/bin/ipcrm")
	push("e2e-test-images/ipc-utils:1.4", ipc, kubeenv.Process{Cmd: []string{"sh"}})

	// agnhost: its Dockerfile's user and group, the porter's certificate,
	// /uploads; the previous version (AgnhostPrev) is the same image.
	agnhostUsers := "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"
	agnhostGroups := "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"
	newAgnhost := func() *imageBase {
		b := newImageBase(t, bashSh, agnhostUsers, agnhostGroups)
		b.hostProgram(t, e.bin("agnhost"), "agnhost")
		b.link("agnhost-2", "agnhost")
		// The specs' hooks and probes of the network call curl in agnhost.
		b.hostProgram(t, "/usr/bin/curl", "usr/bin/curl")
		// Upstream's agnhost is built on Alpine, whose os-release the
		// ImageVolume specs read through kitten's volume: this one names it,
		// and says what this image is.
		b.file("etc/os-release", 0o644, []byte("NAME=\"Alpine Linux\"\nID=alpine\nPRETTY_NAME=\"Alpine Linux (berth's offline stand-in for agnhost's base: Debian programs)\"\n"))
		b.dir("uploads", 0o755)
		b.file("localhost.crt", 0o644, []byte(readFile(t, filepath.Join(k8sSrc, "test/images/agnhost/porter/localhost.crt"))))
		b.file("localhost.key", 0o644, []byte(readFile(t, filepath.Join(k8sSrc, "test/images/agnhost/porter/localhost.key"))))
		return b
	}
	agnhostProcess := kubeenv.Process{Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}}
	for _, version := range []string{"2.66.1", "2.55"} {
		push("e2e-test-images/agnhost:"+version, newAgnhost(), agnhostProcess)
	}
	// kitten and nautilus: agnhost's test-webserver serving a picture.
	for _, name := range []string{"kitten", "nautilus"} {
		b := newAgnhost()
		html := filepath.Join(k8sSrc, "test/images", name, "html")
		b.file(name+".jpg", 0o644, []byte(readFile(t, filepath.Join(html, name+".jpg"))))
		b.file("data.json", 0o644, []byte(readFile(t, filepath.Join(html, "data.json"))))
		push("e2e-test-images/"+name+":1.8", b, kubeenv.Process{Entrypoint: []string{"/agnhost"}, Cmd: []string{"test-webserver"}})
	}
	// pause: agnhost's pause, which ends on SIGTERM as upstream's pause does.
	pauseImage := newImageBase(t, busyboxSh, "", "")
	pauseImage.hostProgram(t, e.bin("agnhost"), "agnhost")
	push("pause:3.10.2", pauseImage, pause)

	// nginx: Debian's nginx-light serving /usr/share/nginx/html on port 80,
	// in the foreground, its logs on the container's output.
	for _, version := range []string{"1.27.0-2", "1.28.0-2"} {
		b := newImageBase(t, busyboxSh, "", "")
		b.hostProgram(t, "/usr/sbin/nginx", "usr/sbin/nginx")
		b.file("etc/nginx/mime.types", 0o644, []byte(readFile(t, "/etc/nginx/mime.types")))
		b.file("etc/nginx/nginx.conf", 0o644, []byte(nginxConf))
		b.file("usr/share/nginx/html/index.html", 0o644, []byte("<html><body>Welcome to nginx!</body></html>\n"))
		b.dir("var/lib/nginx", 0o755)
		b.dir("var/log/nginx", 0o755)
		b.dir("run", 0o755)
		push("e2e-test-images/nginx:"+version, b, kubeenv.Process{Cmd: []string{"nginx", "-g", "daemon off;"}})
	}

	// glibc-dns-testing: glibc's resolver behind hostname -f.
	dns := newImageBase(t, busyboxSh, "", "")
	dns.hostProgram(t, "/bin/hostname", "usr/bin/hostname") // before busybox's in PATH
	push("e2e-test-images/glibc-dns-testing:2.1.1", dns, kubeenv.Process{Cmd: []string{"sh"}})

	var list strings.Builder
	for key, p := range e2eRegistries {
		fmt.Fprintf(&list, "%s: %s\n", key, strings.TrimSuffix(e.reg.Host+"/"+p, "/"))
	}
	repoList := e.path("e2e-repo-list.yaml")
	if err := os.WriteFile(repoList, []byte(list.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return repoList
}

const nginxConf = `user www-data;
worker_processes 1;
error_log /dev/stderr;
pid /run/nginx.pid;
events {}
http {
	include /etc/nginx/mime.types;
	access_log /dev/stdout;
	server {
		listen 80;
		root /usr/share/nginx/html;
	}
}
`

// shell is what an image's /bin/sh is.
type shell int

const (
	busyboxSh shell = iota // busybox's ash, as upstream's busybox image has
	bashSh                 // bash-static, so that the programs PATH names run
)

// newImageBase starts an image's entries: busybox's applets, bash-static
// as sh and bash in /usr/bin (and /bin/bash in agnhost's, see above), OpenBSD's nc, and users and groups (root, www-data,
// nobody, and the passwd and group lines given).
func newImageBase(t *testing.T, sh shell, users, groups string) *imageBase {
	t.Helper()
	b := &imageBase{seen: map[string]bool{".": true}}
	b.file("bin/busybox", 0o755, []byte(readFile(t, "/bin/busybox")))
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		switch applet {
		case "nc", "busybox":
			continue
		case "sh":
			if sh == bashSh {
				continue
			}
		}
		b.link("bin/"+applet, "busybox")
	}
	b.file("usr/bin/sh", 0o755, []byte(readFile(t, "/bin/bash-static")))
	b.link("usr/bin/bash", "sh")
	if sh == bashSh {
		b.link("bin/sh", "../usr/bin/sh")
		// Specs run /bin/bash, which upstream's agnhost has (Alpine, no usrmerge).
		b.link("bin/bash", "../usr/bin/sh")
	}
	b.hostProgram(t, "/bin/nc.openbsd", "bin/nc")
	passwd := "root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/false\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n" + users
	group := "root:x:0:\nwww-data:x:33:\nnogroup:x:65534:\n" + groups
	b.file("etc/passwd", 0o644, []byte(passwd))
	b.file("etc/group", 0o644, []byte(group))
	b.file("etc/nsswitch.conf", 0o644, []byte("passwd: files\ngroup: files\nhosts: files dns\n"))
	b.dir("root", 0o700)
	b.dir("tmp", 0o1777)
	b.dir("home", 0o755)
	return b
}

// add appends an entry after a folder entry (0755) for each of its
// folders that has none yet.
func (b *imageBase) add(e kubeenv.Entry) {
	var parents []string
	for d := path.Dir(e.Name); !b.seen[d]; d = path.Dir(d) {
		b.seen[d] = true
		parents = append([]string{d}, parents...)
	}
	for _, d := range parents {
		b.entries = append(b.entries, kubeenv.Entry{Name: d, Dir: true, Mode: 0o755})
	}
	b.seen[e.Name] = true
	b.entries = append(b.entries, e)
}

func (b *imageBase) file(name string, mode int64, data []byte) {
	b.add(kubeenv.Entry{Name: name, Mode: mode, Data: data})
}

// setuid sets the set-user-ID bit of the file entry name.
func (b *imageBase) setuid(name string) {
	for i := range b.entries {
		if b.entries[i].Name == name {
			b.entries[i].Mode |= 0o4000
		}
	}
}

func (b *imageBase) link(name, target string) {
	b.add(kubeenv.Entry{Name: name, Link: target, Mode: 0o777})
}

func (b *imageBase) dir(name string, mode int64) {
	if !b.seen[name] {
		b.add(kubeenv.Entry{Name: name, Dir: true, Mode: mode})
	}
}

// hostProgram adds the program bin of the host as name, with every
// shared library ldd names for it (the loader included) at its host path.
// agnhost is one too: built as the cluster's binaries are, with cgo, so
// that it compiles from the packages they left in the build cache.
func (b *imageBase) hostProgram(t *testing.T, bin, name string) {
	t.Helper()
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "not a dynamic executable") {
		t.Fatalf("ldd %s (the e2e images need Debian's %s): %v %s", bin, strings.Join(e2eImagePackages, ", "), err, out)
	}
	b.file(name, 0o755, []byte(readFile(t, bin)))
	// ldd prints "libc.so.6 => /lib/…/libc.so.6 (0x…)", the loader as
	// "/lib64/ld-linux-x86-64.so.2 (0x…)" and the vDSO without a path.
	for _, field := range strings.Fields(string(out)) {
		if lib := strings.TrimPrefix(field, "/"); lib != field && !b.seen[lib] {
			b.file(lib, 0o755, []byte(readFile(t, field)))
		}
	}
}

// kubernetesModuleDir is the kubernetes module's folder in the module
// cache, where the images' other files (certificates, pictures) are.
func kubernetesModuleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(kubeenv.EnvOr("GO", "go"), "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("go list -m k8s.io/kubernetes: %v", err)
	}
	return strings.TrimSpace(string(out))
}
