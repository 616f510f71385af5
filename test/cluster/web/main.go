// Command web is the HTTP server and client baked into the cluster tier's
// test image (busybox's own wget crashes in Debian's static build):
//
//	web serve ADDR   answers GET / with "<version> <hostname>\n", where
//	                 version is the image's /etc/web-version
//	web get URL      prints the body of a 200 answer, else fails
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: web serve ADDR | web get URL")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2])
	case "get":
		err = get(os.Args[2])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "web:", err)
		os.Exit(1)
	}
}

func serve(addr string) error {
	version, err := os.ReadFile("/etc/web-version")
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	answer := strings.TrimSpace(string(version)) + " " + host + "\n"
	fmt.Printf("serving %s on %s", answer, addr)
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, answer) })
	srv := &http.Server{Addr: addr, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

func get(url string) error {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	_, err = os.Stdout.Write(body)
	return err
}
