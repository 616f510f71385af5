// Command berthctl talks to berthd for what crictl cannot do (image import,
// a pod's start timeline as a chart, berthd's setup), lists images and pods
// in compact tables, and checks config files with berthd's own parser.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cri"
)

const usage = `usage: berthctl [--socket PATH] image import FILE
       berthctl [--socket PATH] image ls
       berthctl [--socket PATH] pods
       berthctl [--socket PATH] timeline POD     (ID, ID prefix, NAME or NAMESPACE/NAME)
       berthctl [--socket PATH] info
       berthctl config check FILE
`

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "berthctl: %v\n", err)
		}
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("berthctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	socket := fs.String("socket", "/run/berth/berth.sock", "berthd socket `path`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	args = fs.Args()
	if len(args) == 3 && args[0] == "config" && args[1] == "check" {
		return configCheck(stdout, args[2]) // no daemon needed
	}
	var cmd func(context.Context, *grpc.ClientConn, io.Writer) error
	switch {
	case len(args) == 1 && args[0] == "pods":
		cmd = podList
	case len(args) == 2 && args[0] == "timeline":
		cmd = func(ctx context.Context, c *grpc.ClientConn, w io.Writer) error { return timeline(ctx, c, w, args[1]) }
	case len(args) == 1 && args[0] == "info":
		cmd = info
	case len(args) < 2 || args[0] != "image":
		fs.Usage()
		return fmt.Errorf("unknown command %q", strings.Join(args, " "))
	case args[1] == "import" && len(args) == 3:
		// berthd opens the file on its own host; make it absolute here so a
		// relative name means the user's directory, not berthd's.
		path, err := filepath.Abs(args[2])
		if err != nil {
			return err
		}
		cmd = func(ctx context.Context, c *grpc.ClientConn, w io.Writer) error { return imageImport(ctx, c, w, path) }
	case (args[1] == "ls" || args[1] == "list") && len(args) == 2:
		cmd = imageList
	default:
		fs.Usage()
		return fmt.Errorf("unknown command %q", strings.Join(args, " "))
	}

	sock, err := filepath.Abs(*socket)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+sock,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return err
	}
	defer conn.Close()
	// An import of a large tarball takes a while; a stuck daemon should not
	// hang a script forever either.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := cmd(ctx, conn, stdout); err != nil {
		if st, ok := status.FromError(err); ok {
			return fmt.Errorf("%s (%s)", st.Message(), st.Code())
		}
		return err
	}
	return nil
}

func imageImport(ctx context.Context, conn *grpc.ClientConn, w io.Writer, path string) error {
	resp, err := cri.NewExtensionClient(conn).Import(ctx, &runtimeapi.ImageSpec{Image: path})
	if err != nil {
		return err
	}
	for _, img := range resp.Images {
		tags := strings.Join(img.RepoTags, " ")
		if tags == "" {
			tags = "<none>"
		}
		fmt.Fprintf(w, "imported %s %s\n", img.Id, tags)
	}
	return nil
}

func imageList(ctx context.Context, conn *grpc.ClientConn, w io.Writer) error {
	resp, err := runtimeapi.NewImageServiceClient(conn).ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tIMAGE ID\tSIZE")
	for _, img := range resp.Images {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", imageName(img), shortID(img.Id), humanSize(img.Size))
	}
	return tw.Flush()
}

func imageName(img *runtimeapi.Image) string {
	if len(img.RepoTags) > 0 {
		return img.RepoTags[0]
	}
	if len(img.RepoDigests) > 0 {
		return img.RepoDigests[0]
	}
	return "<none>"
}

// shortID is the first 13 hex digits of the digest, as crictl prints it.
func shortID(id string) string {
	_, hex, ok := strings.Cut(id, ":")
	if !ok {
		hex = id
	}
	if len(hex) > 13 {
		hex = hex[:13]
	}
	return hex
}

// humanSize prints decimal units with three significant digits, like crictl
// and docker ("7.38MB"), so sizes can be compared between the tools.
func humanSize(n uint64) string {
	units := []string{"B", "kB", "MB", "GB", "TB", "PB"}
	f := float64(n)
	i := 0
	for f >= 999.5 && i < len(units)-1 { // 999.5 would print as "1e+03"
		f /= 1000
		i++
	}
	return fmt.Sprintf("%.3g%s", f, units[i])
}
