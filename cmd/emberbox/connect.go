package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

// serverFlags say which server a client command talks to, and with which
// key. Every client command (usage, sandbox …) resolves them alike.
type serverFlags struct {
	server, key, dataDir string
}

func (f *serverFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.server, "server", "", "the server's URL (default $EMBERBOX_URL, else the config file, else "+emberbox.DefaultURL+")")
	fs.StringVar(&f.key, "key", "", "API key (default $EMBERBOX_API_KEY, else the config file, else the admin key in --data-dir)")
	fs.StringVar(&f.dataDir, "data-dir", defaultDataDir(), "where a local server keeps its admin key")
}

// serverHelp says where a client command finds its server and key.
const serverHelp = "The server and key come from --server and --key, else $EMBERBOX_URL and\n" +
	"$EMBERBOX_API_KEY (or $RUNTIME_API_URL and $RUNTIME_API_KEY), else\n" +
	"~/.config/emberbox/config.json ({\"server\": ..., \"key\": ...}), else\n" +
	"http://127.0.0.1:8080 and the admin key in --data-dir."

// apiFlags are the flags of a client command whose answer a program may
// read: the server and key, and --json.
type apiFlags struct {
	serverFlags
	json bool
}

func (f *apiFlags) register(fs *pflag.FlagSet) {
	f.serverFlags.register(fs)
	fs.BoolVar(&f.json, "json", false, "print the answer as JSON instead of text")
}

// print writes v as JSON with --json, else as text writes it.
func (f *apiFlags) print(w io.Writer, v any, text func(io.Writer) error) error {
	if f.json {
		return writeJSONTo(w, v)
	}
	return text(w)
}

// clientConfig is ~/.config/emberbox/config.json.
type clientConfig struct {
	Server string `json:"server"`
	Key    string `json:"key"`
}

// configPath is $EMBERBOX_CONFIG, else emberbox/config.json in the user's
// config directory ($XDG_CONFIG_HOME or ~/.config).
func configPath() string {
	if p := os.Getenv("EMBERBOX_CONFIG"); p != "" {
		return p
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "emberbox", "config.json")
}

// readConfig reads the config file; a missing one is empty.
func readConfig() (clientConfig, error) {
	var c clientConfig
	p := configPath()
	if p == "" {
		return c, nil
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("reading %s: %w", p, err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: want {\"server\": URL, \"key\": KEY}: %w", p, err)
	}
	return c, nil
}

// resolve picks the server and key: flags, else the environment, else
// the config file, else a local server and its admin key.
func (f *serverFlags) resolve() (server, key string, err error) {
	cfg, err := readConfig()
	if err != nil {
		return "", "", err
	}
	server = firstOf(f.server, os.Getenv("EMBERBOX_URL"), os.Getenv("EMBERBOX_API_URL"), os.Getenv("RUNTIME_API_URL"),
		cfg.Server, emberbox.DefaultURL)
	key = firstOf(f.key, os.Getenv("EMBERBOX_API_KEY"), os.Getenv("RUNTIME_API_KEY"), cfg.Key)
	if key == "" {
		b, err := os.ReadFile(filepath.Join(f.dataDir, adminKeyFile))
		if err != nil {
			return "", "", fmt.Errorf("no key: pass --key, set EMBERBOX_API_KEY or write %s (%w)", configPath(), err)
		}
		key = strings.TrimSpace(string(b))
	}
	return strings.TrimRight(server, "/"), key, nil
}

// client makes an SDK client of the resolved server.
func (f *serverFlags) client() (*emberbox.Client, error) {
	server, key, err := f.resolve()
	if err != nil {
		return nil, err
	}
	return emberbox.NewClient(server, key)
}

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
