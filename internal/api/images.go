package api

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// The image catalog's routes (withruntime images.*). The registries
// routes are not built: they answer 501 (unavailable.go).

// imageJSON is the wire form of an image.
type imageJSON struct {
	ID           string             `json:"id"`
	Kind         string             `json:"kind"`
	Name         *string            `json:"name"`
	Version      int                `json:"version,omitempty"`
	Tags         []string           `json:"tags"`
	State        string             `json:"state"`
	Source       string             `json:"source"`
	Error        *string            `json:"error"`
	Digest       *string            `json:"digest"`
	SizeBytes    int64              `json:"sizeBytes"`
	DiskMiB      int                `json:"diskMiB"`
	Env          map[string]string  `json:"env"`
	Workdir      *string            `json:"workdir"`
	User         *string            `json:"user"`
	Start        *catalog.StartSpec `json:"start"`
	Labels       map[string]string  `json:"labels"`
	Public       bool               `json:"public"`
	CreatedAt    *jsonTime          `json:"createdAt"`
	ReadyAt      *jsonTime          `json:"readyAt"`
	BuildSeconds float64            `json:"buildSeconds"`
}

func toImageJSON(img *catalog.Image) imageJSON {
	tags, env, labels := img.Tags, img.Env, img.Labels
	if tags == nil {
		tags = []string{}
	}
	if env == nil {
		env = map[string]string{}
	}
	if labels == nil {
		labels = map[string]string{}
	}
	return imageJSON{
		ID: img.ID, Kind: "image", Name: optString(img.Name), Version: img.Version, Tags: tags, State: img.State,
		Source: img.Kind, Error: optString(img.Error), Digest: optString(img.Digest), SizeBytes: img.SizeBytes,
		DiskMiB: img.DiskMiB, Env: env, Workdir: optString(img.Workdir), User: optString(img.User), Start: img.Start,
		Labels: labels, Public: img.Public, CreatedAt: optTime(&img.CreatedAt), ReadyAt: optTime(img.ReadyAt),
		BuildSeconds: img.BuildSeconds,
	}
}

// imageCreateRequest is POST /v1/images, as withruntime sends it.
type imageCreateRequest struct {
	Image      string           `json:"image"`
	Dockerfile string           `json:"dockerfile"`
	Recipe     *recipeJSON      `json:"recipe"`
	Files      []catalog.File   `json:"files"`
	Context    *catalog.Context `json:"context"`
	// Archive: an uploaded OCI layout or docker save tarball to import
	// (Emberbox's own field; its chunks go up as a context's do).
	Archive      *catalog.ContextArchive `json:"archive"`
	Dockerignore string                  `json:"dockerignore"` // applied by the client when it packed the context
	Target       string                  `json:"target"`
	BuildArgs    map[string]string       `json:"buildArgs"`
	Name         string                  `json:"name"`
	Tags         []string                `json:"tags"`
	Labels       map[string]string       `json:"labels"`
	Region       string                  `json:"region"`
	Build        *buildJSON              `json:"build"`
	Env          map[string]string       `json:"env"`
	Start        *catalog.StartSpec      `json:"start"`
	Cache        *bool                   `json:"cache"`
}

type recipeJSON struct {
	catalog.Recipe
	Run []string `json:"run,omitempty"` // Commands by its other name
}

type buildJSON struct {
	TimeoutSeconds int `json:"timeoutSeconds"`
	MaxImageMiB    int `json:"maxImageMiB"`
	DiskMiB        int `json:"diskMiB"`
	MemoryMiB      int `json:"memoryMiB"`
	VCPU           int `json:"vcpu"`
	CacheMiB       int `json:"cacheMiB"` // accepted; the cache is bounded by the server
}

const maxImageBody = 20 << 20

func (s *server) imagesOn() (*catalog.Service, error) {
	if s.images == nil {
		return nil, newError(http.StatusNotImplemented, "images_unavailable", "This server does not offer images.")
	}
	return s.images, nil
}

func (s imagesAPI) create(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, err := s.imagesOn()
	if err != nil {
		return err
	}
	var req imageCreateRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	issues := labelIssues(req.Labels)
	issues = append(issues, envIssues("env", req.Env)...)
	if req.Region != "" && req.Region != "local" {
		issues = append(issues, issue{Path: "region", Message: `must be "local" (the only region of this server)`})
	}
	if len(req.BuildArgs) > 64 {
		issues = append(issues, issue{Path: "buildArgs", Message: "at most 64"})
	}
	if req.Recipe != nil {
		issues = append(issues, envIssues("recipe.env", req.Recipe.Env)...)
	}
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	cr := catalog.CreateRequest{Name: req.Name, Tags: req.Tags, Labels: req.Labels}
	cr.Source = catalog.Source{
		Dockerfile: req.Dockerfile, Files: req.Files, Context: req.Context, BuildArgs: req.BuildArgs, Target: req.Target,
		Reference: req.Image, Archive: req.Archive, Env: req.Env, Start: req.Start, Cache: req.Cache,
		// "start": null is the SDK's no_start.
		NoStart: nullField(c.body, "start"),
	}
	if req.Recipe != nil {
		rec := req.Recipe.Recipe
		rec.Commands = append(rec.Commands, req.Recipe.Run...)
		cr.Recipe = &rec
	}
	if b := req.Build; b != nil {
		cr.Build = catalog.BuildLimits{TimeoutSeconds: b.TimeoutSeconds, MaxImageMiB: b.MaxImageMiB, DiskMiB: b.DiskMiB,
			MemoryMiB: b.MemoryMiB, VCPU: b.VCPU}
	}
	img, err := svc.Create(r.Context(), c.owner, cr)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, toImageJSON(img))
	return nil
}

func (s imagesAPI) list(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, err := s.imagesOn()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	limit := 50
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return invalid([]issue{{Path: "limit", Message: "must be from 1 to 100"}})
		}
		limit = n
	}
	switch st := q.Get("state"); st {
	case "", catalog.StateQueued, catalog.StateBuilding, catalog.StateReady, catalog.StateFailed, catalog.StateDeleted:
	default:
		return invalid([]issue{{Path: "state", Message: "must be queued, building, ready, failed or deleted"}})
	}
	list, err := svc.List(r.Context(), catalog.ListOptions{Owner: c.owner, State: q.Get("state"), Name: q.Get("name"),
		Limit: limit + 1, Cursor: q.Get("cursor")})
	if err != nil {
		return err
	}
	var next string
	if len(list) > limit {
		list = list[:limit]
		next = list[limit-1].ID
	}
	writeJSON(w, http.StatusOK, pageOf(list, next, toImageJSON))
	return nil
}

// imageOf returns the catalog and the {id} of an image route; the
// registries routes share its shape and are not built here.
func (s imagesAPI) imageOf(r *http.Request) (*catalog.Service, string, error) {
	svc, err := s.imagesOn()
	if err != nil {
		return nil, "", err
	}
	id := r.PathValue("id")
	if id == "registries" {
		return nil, "", notServed(r)
	}
	return svc, id, nil
}

func (s imagesAPI) get(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, id, err := s.imageOf(r)
	if err != nil {
		return err
	}
	img, err := svc.Get(r.Context(), c.owner, id)
	return reply(w, img, err, toImageJSON)
}

func (s imagesAPI) resolve(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, err := s.imagesOn()
	if err != nil {
		return err
	}
	ref := r.URL.Query().Get("ref")
	if ref == "" {
		return invalid([]issue{{Path: "ref", Message: "is required: an id, name, name:tag or name@version"}})
	}
	img, err := svc.Resolve(r.Context(), c.owner, ref)
	return reply(w, img, err, toImageJSON)
}

type tagRequest struct {
	Tag string `json:"tag"`
}

func (s imagesAPI) tag(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.changeTag(w, r, c, true)
}

func (s imagesAPI) untag(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.changeTag(w, r, c, false)
}

func (s imagesAPI) changeTag(w http.ResponseWriter, r *http.Request, c *call, add bool) error {
	svc, id, err := s.imageOf(r)
	if err != nil {
		return err
	}
	var req tagRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.Tag == "" {
		return invalid([]issue{{Path: "tag", Message: "is required"}})
	}
	var img *catalog.Image
	if add {
		img, err = svc.Tag(r.Context(), c.owner, id, req.Tag)
	} else {
		img, err = svc.Untag(r.Context(), c.owner, id, req.Tag)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toImageJSON(img))
	return nil
}

func (s imagesAPI) delete(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, id, err := s.imageOf(r)
	if err != nil {
		return err
	}
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	img, err := svc.Delete(r.Context(), c.owner, id)
	return reply(w, img, err, toImageJSON)
}

type logLineJSON struct {
	Type   string    `json:"type,omitempty"` // "line" in a stream
	Seq    int64     `json:"seq"`
	At     *jsonTime `json:"at"`
	Stream string    `json:"stream"`
	Text   string    `json:"text"`
}

func toLogLineJSON(l catalog.LogLine) logLineJSON {
	return logLineJSON{Seq: l.Seq, At: optTime(&l.At), Stream: l.Stream, Text: l.Text}
}

// logFollowMax bounds one following answer; the client resumes after a
// "continue" event.
const logFollowMax = 5 * time.Minute

const logPageLines = 1000

func (s imagesAPI) logs(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, id, err := s.imageOf(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var after int64
	if v := q.Get("after"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil || after < 0 {
			return invalid([]issue{{Path: "after", Message: "must be a seq, 0 or more"}})
		}
	}
	follow, _ := strconv.ParseBool(q.Get("follow"))
	if !follow {
		page, err := svc.Logs(r.Context(), c.owner, id, after, logPageLines)
		if err != nil {
			return err
		}
		lines := make([]logLineJSON, 0, len(page.Lines))
		for _, l := range page.Lines {
			lines = append(lines, toLogLineJSON(l))
		}
		writeJSON(w, http.StatusOK, map[string]any{"lines": lines, "nextAfter": page.NextAfter, "done": page.Done})
		return nil
	}
	if _, err := svc.Get(r.Context(), c.owner, id); err != nil {
		return err
	}
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	var mu sync.Mutex
	write := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if _, err := w.Write(append(b, '\n')); err != nil {
			return err
		}
		return rc.Flush()
	}
	_ = rc.Flush()
	img, last, err := svc.Follow(r.Context(), c.owner, id, after, logFollowMax, func(l catalog.LogLine) error {
		j := toLogLineJSON(l)
		j.Type = "line"
		return write(j)
	})
	switch {
	case err != nil:
		ae := toAPIError(err)
		return errOr(write(map[string]any{"type": "error", "error": map[string]any{"code": ae.Code, "message": ae.Message}}), err)
	case img == nil:
		return write(map[string]any{"type": "continue", "after": last})
	}
	return write(map[string]any{"type": "done", "image": toImageJSON(img)})
}

type missingRequest struct {
	Digests []string `json:"digests"`
}

func (s imagesAPI) missingChunks(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, err := s.imagesOn()
	if err != nil {
		return err
	}
	var req missingRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	missing, err := svc.Missing(c.owner, req.Digests)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"missing": missing})
	return nil
}

func (s imagesAPI) putChunk(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, err := s.imagesOn()
	if err != nil {
		return err
	}
	digest := r.PathValue("digest")
	if err := svc.PutChunk(c.owner, digest, bytes.NewReader(c.body)); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"digest": digest, "size": len(c.body)})
	return nil
}

// createImageSpec resolves a sandbox create's image field: the image to boot
// (nil for the default image) with its environment under the create's.
func (s *server) createImageSpec(r *http.Request, owner string, raw json.RawMessage, req *createRequest,
	spec *sandbox.CreateSpec) error {
	var ref string
	if err := json.Unmarshal(raw, &ref); err != nil || ref == "" {
		return invalid([]issue{{Path: "image", Message: "must be an image id, name, name:tag or name@version"}})
	}
	if req.Snapshot != "" {
		return invalid([]issue{{Path: "image", Message: "a copy of a snapshot boots the snapshot's image; leave image out"}})
	}
	svc, err := s.imagesOn()
	if err != nil {
		return err
	}
	ref2, img, err := svc.ForCreate(r.Context(), owner, ref)
	if err != nil {
		return err
	}
	spec.Image = ref2
	if ref2 != nil && req.DiskMiB == nil && spec.DiskMiB < ref2.MinDiskMiB {
		spec.DiskMiB = ref2.MinDiskMiB
	}
	if len(img.Env) > 0 {
		env := maps.Clone(img.Env)
		maps.Copy(env, spec.Env)
		spec.Env = env
	}
	return nil
}

// startJSON reports a sandbox's start command.
type startJSON struct {
	Command string  `json:"command"`
	Ready   bool    `json:"ready"`
	ReadyMs *int64  `json:"readyMs"`
	Error   *string `json:"error,omitempty"`
}

func (s *server) startReport(id string) *startJSON {
	if s.images == nil {
		return nil
	}
	rep, ok := s.images.StartReport(id)
	if !ok {
		return nil
	}
	out := &startJSON{Command: rep.Command, Ready: rep.Ready, Error: optString(rep.Error)}
	if rep.Ready {
		out.ReadyMs = &rep.ReadyMs
	}
	return out
}
