package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/emberbox/emberbox/internal/secrets"
)

// EgressCAs is the server's side of /v1/egress-ca (admin keys): the CAs
// guests trust for egress secrets' hosts, and their rotation.
type EgressCAs interface {
	// Status describes the CAs in force, oldest first, with how many
	// running guests are known to trust each.
	Status(ctx context.Context) []secrets.CAInfo
	// Rotate puts a new CA in force, keeps the others trusted for keep,
	// and sends running guests the new set before it answers.
	Rotate(ctx context.Context, keep time.Duration) (*secrets.Rotation, error)
}

type egressCAJSON struct {
	ID          string    `json:"id"`
	Certificate string    `json:"certificate"`
	NotAfter    jsonTime  `json:"notAfter"`
	AddedAt     jsonTime  `json:"addedAt"`
	RetireAt    *jsonTime `json:"retireAt"`
	Newest      bool      `json:"newest"`
	// Guests: running sandboxes known to trust it, and the others.
	Guests struct {
		Trusting int `json:"trusting"`
		NotKnown int `json:"notKnown"`
	} `json:"guests"`
}

func toEgressCAJSON(i secrets.CAInfo) egressCAJSON {
	out := egressCAJSON{ID: i.ID, Certificate: i.CertPEM, NotAfter: jsonTime(i.NotAfter), AddedAt: jsonTime(i.AddedAt),
		RetireAt: optTime(i.RetireAt), Newest: i.Newest}
	out.Guests.Trusting, out.Guests.NotKnown = i.Guests, i.NotGuests
	return out
}

func toEgressCAsJSON(list []secrets.CAInfo) []egressCAJSON {
	out := make([]egressCAJSON, 0, len(list))
	for _, i := range list {
		out = append(out, toEgressCAJSON(i))
	}
	return out
}

func (s secretsAPI) adminCAs(c *call) (EgressCAs, error) {
	if c.role != RoleAdmin {
		return nil, newError(http.StatusForbidden, "admin_only", "only an admin key may see or rotate the egress CAs.")
	}
	if s.egressCAs == nil {
		return nil, newError(http.StatusNotImplemented, "egress_ca_unavailable",
			"This server cannot rotate its egress CA: its secrets key is not the one the CAs were sealed under.")
	}
	return s.egressCAs, nil
}

func (s secretsAPI) listCAs(w http.ResponseWriter, r *http.Request, c *call) error {
	cas, err := s.adminCAs(c)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"cas": toEgressCAsJSON(cas.Status(r.Context()))})
	return nil
}

type rotateCARequest struct {
	// KeepPreviousSeconds: how long guests keep trusting the CAs in force
	// now; default a day, 0 retires them at once (a key that may have leaked).
	KeepPreviousSeconds *int64 `json:"keepPreviousSeconds"`
}

func (s secretsAPI) rotateCA(w http.ResponseWriter, r *http.Request, c *call) error {
	cas, err := s.adminCAs(c)
	if err != nil {
		return err
	}
	var req rotateCARequest
	if err := decode(c, &req); err != nil {
		return err
	}
	keep := secrets.DefaultCAKeep
	if k := req.KeepPreviousSeconds; k != nil {
		if *k < 0 || *k > int64(secrets.MaxCAKeep/time.Second) {
			return invalid([]issue{{Path: "keepPreviousSeconds", Message: "must be from 0 to " +
				strconv.Itoa(int(secrets.MaxCAKeep/time.Second))}})
		}
		keep = time.Duration(*k) * time.Second
	}
	rot, err := cas.Rotate(r.Context(), keep)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"new": toEgressCAJSON(rot.New), "previous": toEgressCAsJSON(rot.Previous)})
	return nil
}
