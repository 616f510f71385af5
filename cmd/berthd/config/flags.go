package config

import (
	"flag"
	"fmt"
	"io"
)

// FromArgs parses berthd's command line, loads the config file it names and
// lets the flags that were actually given override the file. It returns
// flag.ErrHelp for -h/--help (usage already written to output).
func FromArgs(args []string, output io.Writer) (*Config, error) {
	fs := flag.NewFlagSet("berthd", flag.ContinueOnError)
	fs.SetOutput(output)
	def := Default()
	path := fs.String("config", DefaultPath, "config `file` (TOML); a missing file is an error only when this flag is given")
	var root, state, socket, level, format string
	fs.StringVar(&root, "root", def.Root, "persistent root `dir`: images, snapshots, meta.db")
	fs.StringVar(&state, "state", def.State, "volatile state `dir`: namespace pins, shim sockets, mounts")
	fs.StringVar(&socket, "socket", def.Socket, "CRI unix socket `path`")
	fs.StringVar(&level, "log-level", def.LogLevel, "log `level`: debug, info, warn or error")
	fs.StringVar(&format, "log-format", def.LogFormat, "log `format`: text or json")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (berthd takes only flags)", fs.Arg(0))
	}

	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	c, err := Load(*path, explicit)
	if err != nil {
		return nil, err
	}

	overrides := map[string]struct {
		dst   *string
		val   string
		check func(string) error
	}{
		"root":       {&c.Root, root, absPath},
		"state":      {&c.State, state, absPath},
		"socket":     {&c.Socket, socket, socketPath},
		"log-level":  {&c.LogLevel, level, oneOf(logLevels)},
		"log-format": {&c.LogFormat, format, oneOf(logFormats)},
	}
	// Only flags given on the command line override the file; Visit skips the rest.
	fs.Visit(func(f *flag.Flag) {
		o, ok := overrides[f.Name]
		if !ok || err != nil {
			return
		}
		if cerr := o.check(o.val); cerr != nil {
			err = fmt.Errorf("--%s %q: %w", f.Name, o.val, cerr)
			return
		}
		*o.dst = o.val
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}
