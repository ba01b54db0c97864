package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/emberbox/emberbox/internal/guestimage"
	"github.com/emberbox/emberbox/internal/store"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "emberbox",
		Short:         "Self-hosted microVM sandboxes for AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.AddCommand(newServeCommand(), newKeysCommand(), newImageCommand(), newImagesCommand(), newDoctorCommand(), newCostCommand(), newUsageCommand(), newNodeCommand(),
		newSandboxCommand(), newWebhookCommand(), newEventsCommand(), newSecretCommand())
	return root
}

func defaultDataDir() string {
	if d := os.Getenv("EMBERBOX_DATA_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "emberbox-data"
	}
	return filepath.Join(home, ".local", "share", "emberbox")
}

func newKeysCommand() *cobra.Command {
	var dataDir, storeURL string
	keys := &cobra.Command{Use: "keys", Short: "Manage API keys"}
	keys.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir(), "server data directory")
	keys.PersistentFlags().StringVar(&storeURL, "store", "", storeUsage)
	keys.AddCommand(newKeysCreateCommand(&dataDir, &storeURL), newKeysListCommand(&dataDir, &storeURL),
		newKeysRevokeCommand(&dataDir, &storeURL), newKeysRotateCommand(&dataDir, &storeURL))
	return keys
}

func newKeysCreateCommand(dataDir, storeURL *string) *cobra.Command {
	var name, role, expires string
	create := &cobra.Command{
		Use:   "create",
		Short: "Create an API key and print it (it is stored only as a hash)",
		Args:  cobra.NoArgs,
		RunE: withStore(dataDir, storeURL, func(cmd *cobra.Command, st *store.Store) error {
			k, secret, err := st.NewKey(name)
			if err != nil {
				return err
			}
			k.Role = role
			if k.ExpiresAt, err = parseExpiry(expires, time.Now()); err != nil {
				return err
			}
			if err := st.InsertKey(cmd.Context(), k, secret); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "created key %s (%s, %s%s)\n", k.ID, k.Name, k.Role, expiryNote(k.ExpiresAt))
			fmt.Fprintln(cmd.OutOrStdout(), secret)
			return nil
		}),
	}
	create.Flags().StringVar(&name, "name", "key", "a name to recognise the key by")
	create.Flags().StringVar(&role, "role", store.RoleTenant, `"tenant" (its own sandboxes) or "admin" (may also list every key and sandbox)`)
	create.Flags().StringVar(&expires, "expires", "", "when the key stops working: a duration (720h, 30d) or an RFC 3339 time; default never")
	return create
}

func newKeysListCommand(dataDir, storeURL *string) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List API keys: id, name, role, created, expires, state (secrets are not kept)",
		Args:  cobra.NoArgs,
		RunE: withStore(dataDir, storeURL, func(cmd *cobra.Command, st *store.Store) error {
			ks, err := st.ListKeys(cmd.Context())
			if err != nil {
				return err
			}
			now := time.Now()
			for _, k := range ks {
				exp, state := "never", "active"
				if k.ExpiresAt != nil {
					exp = k.ExpiresAt.UTC().Format(time.RFC3339)
				}
				switch {
				case k.RevokedAt != nil:
					state = "revoked " + k.RevokedAt.UTC().Format(time.RFC3339)
				case !k.Active(now):
					state = "expired"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Role,
					k.CreatedAt.Format("2006-01-02T15:04:05Z"), exp, state)
			}
			return nil
		}),
	}
}

func newKeysRevokeCommand(dataDir, storeURL *string) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke KEY_ID",
		Short: "Revoke a key at once; its sandboxes stay until they end or an admin deletes them",
		Args:  cobra.ExactArgs(1),
		RunE: withStoreArgs(dataDir, storeURL, func(cmd *cobra.Command, st *store.Store, args []string) error {
			k, err := st.RevokeKey(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "revoked key %s (%s)\n", k.ID, k.Name)
			return nil
		}),
	}
}

func newKeysRotateCommand(dataDir, storeURL *string) *cobra.Command {
	var grace time.Duration
	var rotateExpires string
	rotate := &cobra.Command{
		Use:   "rotate KEY_ID",
		Short: "Give a key a new secret and print it; the key keeps its id and sandboxes",
		Args:  cobra.ExactArgs(1),
		RunE: withStoreArgs(dataDir, storeURL, func(cmd *cobra.Command, st *store.Store, args []string) error {
			ctx := cmd.Context()
			if rotateExpires != "" {
				exp, err := parseExpiry(rotateExpires, time.Now())
				if err != nil {
					return err
				}
				if _, err := st.SetKeyExpiry(ctx, args[0], exp); err != nil {
					return err
				}
			}
			k, secret, err := st.RotateKey(ctx, args[0], grace)
			if err != nil {
				return err
			}
			note := "the old secret no longer works"
			if grace > 0 {
				note = "the old secret works for " + grace.String() + " more"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "rotated key %s (%s%s); %s\n", k.ID, k.Name, expiryNote(k.ExpiresAt), note)
			fmt.Fprintln(cmd.OutOrStdout(), secret)
			return nil
		}),
	}
	rotate.Flags().DurationVar(&grace, "grace", 0, "how long the old secret keeps working")
	rotate.Flags().StringVar(&rotateExpires, "expires", "", `a new expiry: a duration, an RFC 3339 time, or "never"`)
	return rotate
}

// parseExpiry reads --expires: "" or "never" for none, a duration from now
// (Go syntax, or whole days as "30d"), or an RFC 3339 time.
func parseExpiry(s string, now time.Time) (*time.Time, error) {
	if s == "" || s == "never" {
		return nil, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return &t, nil
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil {
			return nil, fmt.Errorf("--expires %q: want a duration (720h, 30d) or an RFC 3339 time", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return nil, fmt.Errorf("--expires %q: want a duration (720h, 30d) or an RFC 3339 time", s)
		}
	}
	if d <= 0 {
		return nil, fmt.Errorf("--expires %q: must be in the future", s)
	}
	t := now.Add(d).UTC()
	return &t, nil
}

func expiryNote(t *time.Time) string {
	if t == nil {
		return ""
	}
	return ", expires " + t.UTC().Format(time.RFC3339)
}

// withStoreArgs is withStore for commands with arguments.
func withStoreArgs(dataDir, storeURL *string, fn func(*cobra.Command, *store.Store, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		return withStore(dataDir, storeURL, func(cmd *cobra.Command, st *store.Store) error { return fn(cmd, st, args) })(cmd, args)
	}
}

// withStore runs fn with the store *storeURL names (see storeDSN), else
// that of the data dir *dataDir, closing it after.
func withStore(dataDir, storeURL *string, fn func(*cobra.Command, *store.Store) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		st, err := store.Open(cmd.Context(), storeDSN(*storeURL, *dataDir))
		if err != nil {
			return err
		}
		defer st.Close()
		return fn(cmd, st)
	}
}

func newImageCommand() *cobra.Command {
	var cacheDir string
	img := &cobra.Command{Use: "image", Short: "Manage the guest image"}
	build := &cobra.Command{
		Use:   "build",
		Short: "Build the default guest image (Debian rootfs and kernel) unless it is cached",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			im, err := guestimage.Ensure(cmd.Context(), guestimage.Config{CacheDir: cacheDir, Progress: cmd.ErrOrStderr()})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "image %s (kernel %s) in %s\n", im.RecipeHash, im.KernelVersion, im.Dir)
			return nil
		},
	}
	build.Flags().StringVar(&cacheDir, "cache-dir", "", "image cache directory (default ~/.cache/emberbox)")
	img.AddCommand(build)
	return img
}
