package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strconv"

	"golang.org/x/sys/unix"
)

// PSI is a cgroup's pressure stall information (Linux 4.20+, cgroup v2):
// how long its tasks waited for CPU, memory and I/O.
type PSI struct {
	CPU, Memory, IO Pressure
}

// Pressure is one resource's pressure file (cpu.pressure, ...). OK is false
// where the kernel keeps none: cgroup v1, a kernel built without PSI or
// booted with it off, a cgroup with cgroup.pressure 0. Some is the time at
// least one task waited, Full the time all did; HasFull is false where the
// file has no full line (cpu.pressure before Linux 5.13).
type Pressure struct {
	Some, Full  PressureData
	OK, HasFull bool
}

// PressureData is one line of a pressure file: the share of time (in %)
// stalled over the last 10, 60 and 300 seconds, and the total time stalled.
type PressureData struct {
	// TotalNanos is in nanoseconds, as the CRI's PsiData.Total; the kernel
	// counts microseconds.
	TotalNanos           uint64
	Avg10, Avg60, Avg300 float64
}

// readPSI reads the three pressure files of the unified cgroup at dir. The
// library's parser (opencontainers/cgroups fs2) is reachable only through
// its full Stats, which would read every controller's files again beside
// the few berth reads (see fileReader).
func (r *fileReader) readPSI(dir string, out *PSI) error {
	if err := r.pressure(dir, "cpu.pressure", &out.CPU); err != nil {
		return err
	}
	if err := r.pressure(dir, "memory.pressure", &out.Memory); err != nil {
		return err
	}
	return r.pressure(dir, "io.pressure", &out.IO)
}

// pressure reads one pressure file into p; a file that is missing, or that
// the kernel refuses to read (PSI off), leaves p not OK.
func (r *fileReader) pressure(dir, name string, p *Pressure) error {
	b, path, err := r.read(dir, name)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.EOPNOTSUPP) {
		return nil
	}
	if err != nil {
		return err
	}
	if *p, err = parsePressure(b); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// parsePressure parses "some avg10=0.12 avg60=0.05 avg300=0.01 total=1234"
// and the same line for "full". A file without a some line is not one.
func parsePressure(b []byte) (Pressure, error) {
	var p Pressure
	hasSome := false
	for line := range bytes.Lines(b) {
		kind, figures, _ := bytes.Cut(bytes.TrimSpace(line), []byte{' '})
		var d *PressureData
		switch string(kind) {
		case "some":
			d, hasSome = &p.Some, true
		case "full":
			d, p.HasFull = &p.Full, true
		default:
			return Pressure{}, fmt.Errorf("line %q: not some or full", line)
		}
		if err := d.parse(figures); err != nil {
			return Pressure{}, fmt.Errorf("line %q: %w", line, err)
		}
	}
	if !hasSome {
		return Pressure{}, errors.New("no some line")
	}
	p.OK = true
	return p, nil
}

// parse reads "avg10=0.12 avg60=0.05 avg300=0.01 total=1234"; each of the
// four must be there.
func (d *PressureData) parse(figures []byte) error {
	seen := 0
	for _, f := range bytes.Fields(figures) {
		k, v, _ := bytes.Cut(f, []byte{'='})
		var err error
		switch string(k) {
		case "avg10":
			d.Avg10, err = strconv.ParseFloat(string(v), 64)
		case "avg60":
			d.Avg60, err = strconv.ParseFloat(string(v), 64)
		case "avg300":
			d.Avg300, err = strconv.ParseFloat(string(v), 64)
		case "total":
			d.TotalNanos, err = strconv.ParseUint(string(v), 10, 64)
			d.TotalNanos *= 1000
		default:
			continue // a field a later kernel adds
		}
		if err != nil {
			return err
		}
		seen++
	}
	if seen != 4 {
		return errors.New("want avg10, avg60, avg300 and total")
	}
	return nil
}
