package api

import (
	"net/http"

	"github.com/emberbox/emberbox/internal/errdefs"
)

type keyJSON struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Role      string    `json:"role"`
	CreatedAt jsonTime  `json:"createdAt"`
	ExpiresAt *jsonTime `json:"expiresAt"`
	RevokedAt *jsonTime `json:"revokedAt"`
}

// errAdminOnly refuses a tenant key what only an admin key may ask.
func errAdminOnly(field string) *apiError {
	return newError(http.StatusForbidden, "admin_only", field+": only an admin key may ask for other keys' data.").
		withHint("Leave it out to see your own.")
}

// listKeys answers GET /v1/keys. Secrets are never stored, so never shown.
func (s *server) listKeys(w http.ResponseWriter, r *http.Request, c *call) error {
	kl, ok := s.keys.(KeyLister)
	if !ok {
		return errdefs.New(errdefs.ErrUnavailable, "keys_unavailable", "This server does not list keys.")
	}
	keys, err := kl.ListKeys(r.Context())
	if err != nil {
		return err
	}
	out := listJSON[keyJSON]{Data: []keyJSON{}}
	for _, k := range keys {
		if c.role != RoleAdmin && k.ID != c.owner {
			continue
		}
		out.Data = append(out.Data, keyJSON{ID: k.ID, Name: k.Name, Role: k.Role, CreatedAt: jsonTime(k.CreatedAt),
			ExpiresAt: optTime(k.ExpiresAt), RevokedAt: optTime(k.RevokedAt)})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
