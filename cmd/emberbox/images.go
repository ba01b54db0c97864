package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/store"
)

// newImagesCommand is the operator's side of the image catalog: import a
// disk built elsewhere, publish an image to every key.
func newImagesCommand() *cobra.Command {
	var dataDir, storeURL string
	cmd := &cobra.Command{Use: "images", Short: "Manage the image catalog (the API builds images; these are the operator's tools)"}
	var req catalog.ImportRequest
	var startCmd string
	var readyPort, readyTimeout int
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Register a raw ext4 disk image (with the guest's user setup) as a ready image; prints its id",
		Args:  cobra.ExactArgs(1),
		RunE: withStoreArgs(&dataDir, &storeURL, func(cmd *cobra.Command, st *store.Store, args []string) error {
			svc, err := catalog.New(catalog.Config{Store: catalog.Store{ImageRecords: st, ImageTags: st, ImageHolders: st, BuildLogs: st}, DataDir: dataDir})
			if err != nil {
				return err
			}
			req.File = args[0]
			if startCmd != "" {
				req.Start = &catalog.StartSpec{Command: startCmd, ReadyPort: readyPort, ReadyTimeoutSeconds: readyTimeout}
			}
			img, err := svc.Import(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "imported %s as %s (%s, %d MiB)\n", args[0], img, img.Digest, img.DiskMiB)
			fmt.Fprintln(cmd.OutOrStdout(), img.ID)
			return nil
		}),
	}
	f := imp.Flags()
	f.StringVar(&req.Name, "name", "", "the image's name (required)")
	f.StringSliceVar(&req.Tags, "tag", nil, "tags to point at it (default latest)")
	f.StringVar(&req.Owner, "owner", "", "the API key id it belongs to; default: public")
	f.BoolVar(&req.Public, "public", false, "visible to every key")
	f.StringToStringVar(&req.Env, "env", nil, "environment of its sandboxes, NAME=value")
	f.StringVar(&req.Workdir, "workdir", "", "working directory of its start command")
	f.StringVar(&req.User, "user", "", `the account its start command runs as ("user", "root" or another)`)
	f.StringVar(&startCmd, "start-command", "", "a command each sandbox of it runs once booted")
	f.IntVar(&readyPort, "ready-port", 0, "the start command is ready once this guest port accepts")
	f.IntVar(&readyTimeout, "ready-timeout", 0, "seconds to wait for readiness (default 60)")
	_ = imp.MarkFlagRequired("name")

	var unpublish bool
	pub := &cobra.Command{
		Use:   "publish ID",
		Short: "Make an image visible to every key (--undo: its owner's again)",
		Args:  cobra.ExactArgs(1),
		RunE: withStoreArgs(&dataDir, &storeURL, func(cmd *cobra.Command, st *store.Store, args []string) error {
			svc, err := catalog.New(catalog.Config{Store: catalog.Store{ImageRecords: st, ImageTags: st, ImageHolders: st, BuildLogs: st}, DataDir: dataDir})
			if err != nil {
				return err
			}
			img, err := svc.Publish(cmd.Context(), args[0], !unpublish)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "image %s public=%v\n", img.ID, img.Public)
			return nil
		}),
	}
	pub.Flags().BoolVar(&unpublish, "undo", false, "make it private again")
	for _, c := range []*cobra.Command{imp, pub} {
		c.Flags().StringVar(&dataDir, "data-dir", defaultDataDir(), "the server's data directory")
		c.Flags().StringVar(&storeURL, "store", "", storeUsage)
		cmd.AddCommand(c)
	}
	return cmd
}
