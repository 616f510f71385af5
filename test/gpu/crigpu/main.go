// Command crigpu is the GPU check's own tool (test/gpu/run.sh drives it):
//
//	crigpu image --vecadd FILE --out DIR        the check's image as an OCI layout
//	crigpu fake-driver --root DIR --libcuda F   a fake NVIDIA driver tree (dry run)
//	crigpu cdi-spec [--root DIR] --out FILE     the CDI spec of the driver below DIR
//	crigpu check --socket S --spec F ...        the check itself, through the CRI
//	crigpu remove-pods --socket S               removes every pod (run.sh's cleanup)
//
// It is built on the machine with Go (run.sh build) and copied with the
// rest to the GPU host, which needs nothing but its NVIDIA driver.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "crigpu: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: crigpu image|fake-driver|cdi-spec|check|remove-pods [flags]")
	}
	fs := flag.NewFlagSet("crigpu "+args[0], flag.ContinueOnError)
	switch args[0] {
	case "image":
		vecadd := fs.String("vecadd", "", "the cuda-vecadd `binary`")
		out := fs.String("out", "", "the OCI layout `folder` to write")
		if err := parse(fs, args[1:], "vecadd", "out"); err != nil {
			return err
		}
		return buildImage(*out, *vecadd)
	case "fake-driver":
		root := fs.String("root", "", "`folder` to lay the fake driver out in")
		libcuda := fs.String("libcuda", "", "the fake libcuda.so.1 (built from test/gpu/fakecuda.c)")
		if err := parse(fs, args[1:], "root", "libcuda"); err != nil {
			return err
		}
		b, err := os.ReadFile(*libcuda)
		if err != nil {
			return err
		}
		return writeFakeDriver(*root, b, mknod)
	case "cdi-spec":
		root := fs.String("root", "/", "where the driver is: / on a GPU host, a fake tree in the dry run")
		out := fs.String("out", "", "the spec `file` to write (.json)")
		if err := parse(fs, args[1:], "out"); err != nil {
			return err
		}
		return cdiSpec(*root, *out)
	case "check":
		var o checkOptions
		fs.StringVar(&o.socket, "socket", "", "berthd's CRI socket")
		fs.StringVar(&o.spec, "spec", "", "the CDI spec file berthd was given")
		fs.StringVar(&o.state, "state", "", "berthd's --state folder")
		fs.StringVar(&o.logs, "logs", "", "a `folder` for the containers' logs")
		fs.StringVar(&o.cgroupParent, "cgroup-parent", "", "a cgroup `name` of the check's own")
		fs.IntVar(&o.berthdPID, "berthd-pid", 0, "berthd's process ID")
		if err := parse(fs, args[1:], "socket", "spec", "state", "logs", "cgroup-parent", "berthd-pid"); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		return runCheck(ctx, o, os.Stdout)
	case "remove-pods":
		socket := fs.String("socket", "", "berthd's CRI socket")
		if err := parse(fs, args[1:], "socket"); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		return removePods(ctx, *socket)
	}
	return fmt.Errorf("unknown command %q", args[0])
}

// parse parses args and fails when a required flag was not given.
func parse(fs *flag.FlagSet, args []string, required ...string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var missing []string
	for _, name := range required {
		if !set[name] {
			missing = append(missing, "--"+name)
		}
	}
	if len(missing) > 0 || fs.NArg() > 0 {
		return fmt.Errorf("%s: needs %s, and no other arguments", fs.Name(), strings.Join(missing, " "))
	}
	return nil
}

// cdiSpec writes the spec of the driver below root to out and prints what
// it found. On the host, the folders ldconfig names are searched first.
func cdiSpec(root, out string) error {
	var extra []string
	if filepath.Clean(root) == "/" {
		extra = hostLibraryDirs()
	}
	l, err := discover(root, extra)
	if err != nil {
		return err
	}
	s, err := l.spec()
	if err != nil {
		return err
	}
	if err := writeSpec(out, s); err != nil {
		return err
	}
	fmt.Printf("CDI spec %s (cdiVersion %s): %d GPU(s), %d control node(s), %d libraries, %s\n",
		out, s.Version, len(l.gpus), len(l.control), len(l.libraries), l.nvidiaSMI)
	for _, d := range s.Devices {
		fmt.Printf("  device %s=%s\n", s.Kind, d.Name)
	}
	return nil
}
