package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/emberbox/emberbox/internal/image"
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
	root.AddCommand(newServeCommand(), newKeysCommand(), newImageCommand(), newDoctorCommand())
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
	var dataDir, name string
	keys := &cobra.Command{Use: "keys", Short: "Manage API keys"}
	create := &cobra.Command{
		Use:   "create",
		Short: "Create an API key and print it (it is stored only as a hash)",
		Args:  cobra.NoArgs,
		RunE: withStore(&dataDir, func(cmd *cobra.Command, st *store.Store) error {
			k, secret, err := st.CreateKey(cmd.Context(), name)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "created key %s (%s)\n", k.ID, k.Name)
			fmt.Fprintln(cmd.OutOrStdout(), secret)
			return nil
		}),
	}
	create.Flags().StringVar(&name, "name", "key", "a name to recognise the key by")
	list := &cobra.Command{
		Use:   "list",
		Short: "List API keys (ids and names; secrets are not kept)",
		Args:  cobra.NoArgs,
		RunE: withStore(&dataDir, func(cmd *cobra.Command, st *store.Store) error {
			ks, err := st.ListKeys(cmd.Context())
			if err != nil {
				return err
			}
			for _, k := range ks {
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\t%s\n", k.ID, k.Name, k.CreatedAt.Format("2006-01-02T15:04:05Z"))
			}
			return nil
		}),
	}
	keys.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir(), "server data directory")
	keys.AddCommand(create, list)
	return keys
}

// withStore runs fn with the store of the data dir *dataDir, closing it after.
func withStore(dataDir *string, fn func(*cobra.Command, *store.Store) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		st, err := store.Open(cmd.Context(), filepath.Join(*dataDir, dbName))
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
			im, err := image.Ensure(cmd.Context(), image.Config{CacheDir: cacheDir, Progress: cmd.ErrOrStderr()})
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
