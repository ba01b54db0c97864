package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Answers built from errors that carry no code of their own never repeat
// the error's text: it can name host paths, addresses or Go internals.
func TestErrorTextCarriesNoHostInternals(t *testing.T) {
	const dataDir = "/var/lib/emberbox-data"
	raw := []error{
		fmt.Errorf("opening %s/sandboxes/sbx_1/disk.qcow2: %w", dataDir, errdefs.ErrNotFound),
		fmt.Errorf("dial unix %s/sandboxes/sbx_1/agent.sock: %w", dataDir, errdefs.ErrConflict),
		fmt.Errorf("lookup x on 10.0.0.2:53: %w", errdefs.ErrInvalidArgument),
		fmt.Errorf("chmod %s: %w", dataDir, errdefs.ErrPermission),
		fmt.Errorf("reading %s: %w", dataDir, errdefs.ErrUnavailable),
		fmt.Errorf("reading %s: %w", dataDir, errdefs.ErrInternal),
		errors.New("open " + dataDir + "/emberbox.db: no such file"),
	}
	for _, err := range raw {
		ae := toAPIError(err)
		for _, s := range []string{ae.Message, ae.Hint, fmt.Sprint(ae.Details)} {
			if strings.Contains(s, dataDir) || strings.Contains(s, "10.0.0.2") || strings.Contains(s, "lookup") {
				t.Errorf("%v: answer %d %s %q carries host internals", err, ae.Status, ae.Code, s)
			}
		}
		if ae.Status < 400 || ae.Message == "" {
			t.Errorf("%v: answer %d %q", err, ae.Status, ae.Message)
		}
	}
	// Coded errors keep their own words.
	ce := errdefs.New(errdefs.ErrNotFound, "file_not_found", "/workspace/x: no such file")
	if ae := toAPIError(ce); ae.Status != http.StatusNotFound || ae.Message != ce.Message {
		t.Errorf("coded error answered %d %q", ae.Status, ae.Message)
	}
}
