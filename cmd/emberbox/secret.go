package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

// newSecretCommand is `emberbox secret`: egress secrets, credentials that
// sandboxes use through a placeholder without ever seeing them.
func newSecretCommand() *cobra.Command {
	var af apiFlags
	sc := &cobra.Command{
		Use:     "secret",
		Aliases: []string{"secrets"},
		Short:   "Credentials sandboxes use without seeing them (egress secrets)",
		Long: "Egress secrets: sandboxes get a placeholder in an environment variable, and the\n" +
			"server's egress gate puts the value into HTTPS requests to the secret's hosts that\n" +
			"its rules allow. The value goes in on stdin and is never printed or answered.\n" +
			serverHelp,
	}
	af.register(sc.PersistentFlags())
	sc.AddCommand(newSecretSetCommand(&af), newSecretListCommand(&af), newSecretScopeCommand(&af),
		newSecretNarrowCommand(&af), newSecretRmCommand(&af), newSecretCACommand(&af))
	return sc
}

// secretSetOptions are the flags of secret set, as given.
type secretSetOptions struct {
	hosts, rules, labels, sandboxes []string
	header, format, env             string
}

// spec is the secret the flags describe, but for its value.
func (o *secretSetOptions) spec() (emberbox.EgressSecretSpec, error) {
	rules, err := parseRules(o.rules)
	if err != nil {
		return emberbox.EgressSecretSpec{}, err
	}
	only, err := parseScope(o.labels, o.sandboxes)
	if err != nil {
		return emberbox.EgressSecretSpec{}, err
	}
	if o.format != "" && o.header == "" {
		return emberbox.EgressSecretSpec{}, errors.New("--format needs --header: it is the header's value")
	}
	return emberbox.EgressSecretSpec{Hosts: o.hosts, Header: o.header, Format: o.format, Rules: rules,
		Only: only, Env: o.env}, nil
}

func newSecretSetCommand(af *apiFlags) *cobra.Command {
	var o secretSetOptions
	cmd := &cobra.Command{
		Use:   "set NAME --host HOST [flags] < value-file",
		Short: "Store or replace a secret, its value read from stdin (never from an argument)",
		Long: "Store a secret, or replace the one of that name (its placeholder stays). The value\n" +
			"is all of stdin less one trailing newline, so it stays out of shell history and\n" +
			"ps: `emberbox secret set OPENAI_API_KEY --host api.openai.com --rule 'POST /v1/*' < key`.\n" +
			"Without --label or --sandbox a new secret reaches every sandbox of the key and a\n" +
			"replaced one keeps its scope.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec, err := o.spec() // bad flags are refused before stdin is read
			if err != nil {
				return err
			}
			if spec.Value, err = readSecretValue(cmd); err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			sc, err := c.SetEgressSecret(cmd.Context(), args[0], spec)
			if err != nil {
				return fmt.Errorf("setting secret %s: %w", args[0], err)
			}
			return printSecret(cmd, af, sc)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.hosts, "host", nil, "a host the value is sent to: a name or *.domain (repeatable)")
	f.StringVar(&o.header, "header", "", "put the value in this header instead of replacing the placeholder in the usual credential headers")
	f.StringVar(&o.format, "format", "", `the --header's value, with {value} for the secret, e.g. "token {value}" (default "{value}")`)
	f.StringArrayVar(&o.rules, "rule", nil, ruleUsage)
	f.StringArrayVar(&o.labels, "label", nil, labelUsage)
	f.StringArrayVar(&o.sandboxes, "sandbox", nil, "only this sandbox (repeatable)")
	f.StringVar(&o.env, "env", "", "the variable sandboxes see the placeholder in (default NAME)")
	_ = cmd.MarkFlagRequired("host")
	return cmd
}

const (
	ruleUsage = `allow only these requests: "[METHODS] PATH..." as 'GET,POST /v1/*' (paths exact or /prefix/*; ` +
		`no methods or * is every method; repeatable, any may match; default every request)`
	labelUsage = "only sandboxes with these labels, KEY=VALUE[,KEY=VALUE] (repeatable: sandboxes that match any one)"
)

// maxSecretInput bounds what secret set reads from stdin; the server
// refuses values past 8 KiB itself.
const maxSecretInput = 1 << 20

// readSecretValue reads the value of secret set: all of stdin but one
// trailing newline. A terminal is read too, with a word on stderr, so that
// the command does not seem to hang.
func readSecretValue(cmd *cobra.Command) (string, error) {
	in := cmd.InOrStdin()
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprintln(cmd.ErrOrStderr(), "Reading the value from the terminal, where it shows as it is typed; end it with Enter and Ctrl-D. "+
			"(`< file` or a pipe keeps it off the screen.)")
	}
	b, err := io.ReadAll(io.LimitReader(in, maxSecretInput+1))
	if err != nil {
		return "", fmt.Errorf("reading the value from stdin: %w", err)
	}
	if len(b) > maxSecretInput {
		return "", fmt.Errorf("the value on stdin is over %d bytes", maxSecretInput)
	}
	v := string(b)
	if s, ok := strings.CutSuffix(v, "\r\n"); ok {
		v = s
	} else {
		v = strings.TrimSuffix(v, "\n")
	}
	if v == "" {
		return "", errors.New("no value on stdin: give it there, e.g. `emberbox secret set NAME --host HOST < value-file`")
	}
	return v, nil
}

// parseRules reads --rule flags; none is nil (every request).
func parseRules(specs []string) ([]emberbox.EgressRule, error) {
	var rules []emberbox.EgressRule
	for _, s := range specs {
		r, err := parseRule(s)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// parseRule reads one --rule, "[METHODS] PATH...": METHODS a comma list
// (GET,POST; none or * for every method), then paths, exact or /prefix/*,
// separated by spaces.
func parseRule(s string) (emberbox.EgressRule, error) {
	var r emberbox.EgressRule
	fields := strings.Fields(s)
	if len(fields) > 0 && !strings.HasPrefix(fields[0], "/") {
		if fields[0] != "*" {
			for m := range strings.SplitSeq(fields[0], ",") {
				if m == "" || m == "*" {
					return r, fmt.Errorf("--rule %q: methods are GET,POST,... or * alone; want e.g. 'GET,POST /v1/*'", s)
				}
				r.Methods = append(r.Methods, strings.ToUpper(m))
			}
		}
		fields = fields[1:]
	}
	for _, p := range fields {
		if !strings.HasPrefix(p, "/") {
			return r, fmt.Errorf("--rule %q: path %q does not start with /", s, p)
		}
		r.Paths = append(r.Paths, p)
	}
	if len(r.Paths) == 0 {
		return r, fmt.Errorf("--rule %q: no path; want e.g. 'GET,POST /v1/*'", s)
	}
	return r, nil
}

// parseScope reads --label selectors and --sandbox ids; neither is nil.
func parseScope(labels, sandboxes []string) (*emberbox.EgressScope, error) {
	if len(labels) == 0 && len(sandboxes) == 0 {
		return nil, nil
	}
	only := &emberbox.EgressScope{Sandboxes: sandboxes}
	for _, sel := range labels {
		m, err := keyValues("--label", strings.Split(sel, ","))
		if err != nil {
			return nil, err
		}
		only.Labels = append(only.Labels, m)
	}
	return only, nil
}

func newSecretListCommand(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the key's secrets by name: variable, hosts, header, rules, scope (never values)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			list := []emberbox.EgressSecret{}
			for after := ""; ; {
				page, err := c.ListEgressSecrets(cmd.Context(), 100, after)
				if err != nil {
					return err
				}
				list = append(list, page.Secrets...)
				if page.Next == "" || len(page.Secrets) == 0 {
					break
				}
				after = page.Next
			}
			return af.print(cmd.OutOrStdout(), list, func(w io.Writer) error { return printSecrets(w, list) })
		},
	}
}

func newSecretScopeCommand(af *apiFlags) *cobra.Command {
	var labels, sandboxes []string
	cmd := &cobra.Command{
		Use:   "scope NAME [--label K=V ...] [--sandbox ID ...]",
		Short: "Say which sandboxes get a secret; without --label or --sandbox, every sandbox of the key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			only, err := parseScope(labels, sandboxes)
			if err != nil {
				return err
			}
			if only == nil {
				only = &emberbox.EgressScope{}
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			sc, err := c.ScopeEgressSecret(cmd.Context(), args[0], *only)
			if err != nil {
				return fmt.Errorf("scoping secret %s: %w", args[0], err)
			}
			return printSecret(cmd, af, sc)
		},
	}
	cmd.Flags().StringArrayVar(&labels, "label", nil, labelUsage)
	cmd.Flags().StringArrayVar(&sandboxes, "sandbox", nil, "this sandbox (repeatable)")
	return cmd
}

func newSecretNarrowCommand(af *apiFlags) *cobra.Command {
	var hosts, ruleSpecs []string
	cmd := &cobra.Command{
		Use:   "narrow NAME [--host HOST ...] [--rule RULE ...]",
		Short: "Replace a secret's hosts or rules with narrower ones, without its value (widening: set it again)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(hosts) == 0 && len(ruleSpecs) == 0 {
				return errors.New("give --host, --rule or both")
			}
			rules, err := parseRules(ruleSpecs)
			if err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			sc, err := c.NarrowEgressSecret(cmd.Context(), args[0], hosts, rules)
			if err != nil {
				return fmt.Errorf("narrowing secret %s: %w", args[0], err)
			}
			return printSecret(cmd, af, sc)
		},
	}
	cmd.Flags().StringArrayVar(&hosts, "host", nil, "the hosts, within the present ones (repeatable)")
	cmd.Flags().StringArrayVar(&ruleSpecs, "rule", nil, ruleUsage)
	return cmd
}

func newSecretRmCommand(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"delete"},
		Short:   "Erase a secret: its placeholder stops working at once",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			if err := c.DeleteEgressSecret(cmd.Context(), args[0]); err != nil {
				return err
			}
			return af.print(cmd.OutOrStdout(), deletedJSON{Name: args[0], Deleted: true}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "%s\tdeleted\n", args[0])
				return err
			})
		},
	}
}

func printSecret(cmd *cobra.Command, af *apiFlags, sc *emberbox.EgressSecret) error {
	return af.print(cmd.OutOrStdout(), sc, func(w io.Writer) error { return printSecrets(w, []emberbox.EgressSecret{*sc}) })
}

func printSecrets(w io.Writer, list []emberbox.EgressSecret) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tENV\tHOSTS\tHEADER\tRULES\tSCOPE\tUPDATED")
	for _, sc := range list {
		header := "-"
		if sc.Header != nil && *sc.Header != "" {
			header = *sc.Header
			if sc.Format != nil && *sc.Format != "" {
				header += ": " + *sc.Format
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sc.Name, sc.Env, strings.Join(sc.Hosts, ","), header,
			rulesText(sc.Rules), scopeText(sc.Only), sc.UpdatedAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// rulesText writes rules as --rule takes them, "; " between them.
func rulesText(rules []emberbox.EgressRule) string {
	if len(rules) == 0 {
		return "every request"
	}
	parts := make([]string, 0, len(rules))
	for _, r := range rules {
		methods := "*"
		if len(r.Methods) > 0 {
			methods = strings.Join(r.Methods, ",")
		}
		parts = append(parts, methods+" "+strings.Join(r.Paths, " "))
	}
	return strings.Join(parts, "; ")
}

// scopeText writes a scope as its selectors and ids, " or " between them.
func scopeText(only *emberbox.EgressScope) string {
	if only == nil || (len(only.Labels) == 0 && len(only.Sandboxes) == 0) {
		return "every sandbox"
	}
	var parts []string
	for _, sel := range only.Labels {
		pairs := make([]string, 0, len(sel))
		for k, v := range sel {
			pairs = append(pairs, k+"="+v)
		}
		slices.Sort(pairs)
		parts = append(parts, "label "+strings.Join(pairs, ","))
	}
	if len(only.Sandboxes) > 0 {
		parts = append(parts, "sandbox "+strings.Join(only.Sandboxes, ","))
	}
	return strings.Join(parts, " or ")
}
