package computer

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// Action is one thing done on the desktop, as withruntime's sbx.desktop
// sends it (POST …/desktop:act). Coordinates are pixels from the top left.
type Action struct {
	Action   string   `json:"action"`
	X        *int     `json:"x"`
	Y        *int     `json:"y"`
	Button   string   `json:"button"` // left (default), middle, right
	Double   bool     `json:"double"`
	From     []int    `json:"from"` // drag: [x, y]
	To       []int    `json:"to"`
	DX       int      `json:"dx"` // scroll: wheel clicks, positive right
	DY       int      `json:"dy"` // positive down
	Text     string   `json:"text"`
	DelayMs  *int     `json:"delayMs"`
	Keys     string   `json:"keys"` // xdotool key names, space separated
	WindowID string   `json:"windowId"`
	URL      string   `json:"url"`
	Argv     []string `json:"argv"`
}

// Bounds of actions.
const (
	MaxTypeText  = 10_000 // characters
	MaxTypeDelay = 1000   // ms between characters
	MaxKeys      = 32
	MaxScroll    = 100
	MaxURL       = 8 << 10
	MaxArgv      = 64
	MaxArg       = 4 << 10
)

var (
	keyName  = regexp.MustCompile(`^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*$`)
	windowID = regexp.MustCompile(`^[0-9]{1,12}$`)
)

// Act does a on the desktop of sandbox id and answers what it reports
// (the cursor's position, the windows) or {"done": true}.
func (s *Service) Act(ctx context.Context, id string, g Guest, a Action) (map[string]any, error) {
	d, err := runningDesktop(ctx, g)
	if err != nil {
		return nil, err
	}
	switch a.Action {
	case "open":
		return s.open(ctx, id, g, d, a.URL)
	case "launch":
		return launch(ctx, g, a.Argv)
	case "cursor":
		return cursor(ctx, g)
	case "windows":
		return windows(ctx, g)
	}
	argv, err := xdotoolArgv(a, d)
	if err != nil {
		return nil, err
	}
	if _, err := runOnDisplay(ctx, g, argv, 4096); err != nil {
		return nil, err
	}
	return map[string]any{"done": true}, nil
}

// xdotoolArgv is the xdotool command of an input action, checked against
// the desktop's size.
func xdotoolArgv(a Action, d *Desktop) ([]string, error) {
	at := func() ([]string, error) {
		if a.X == nil && a.Y == nil {
			return nil, nil // where the pointer is
		}
		if a.X == nil || a.Y == nil {
			return nil, invalidAction("x and y go together")
		}
		return point(*a.X, *a.Y, d)
	}
	button, err := buttonNumber(a.Button)
	if err != nil {
		return nil, err
	}
	switch a.Action {
	case "move":
		if a.X == nil || a.Y == nil {
			return nil, invalidAction("move needs x and y")
		}
		return point(*a.X, *a.Y, d)
	case "click":
		argv, err := at()
		if err != nil {
			return nil, err
		}
		if argv == nil {
			argv = []string{"xdotool"}
		}
		if a.Double {
			return append(argv, "click", "--repeat", "2", button), nil
		}
		return append(argv, "click", button), nil
	case "mouseDown", "mouseUp":
		return []string{"xdotool", strings.ToLower(a.Action), button}, nil
	case "drag":
		return drag(a, d)
	case "scroll":
		return scroll(a, at)
	case "type":
		return typeArgv(a)
	case "key":
		return keyArgv(a.Keys)
	case "focus":
		if !windowID.MatchString(a.WindowID) {
			return nil, invalidAction("windowId must be a window's id from the windows action")
		}
		return []string{"xdotool", "windowactivate", "--sync", a.WindowID}, nil
	}
	return nil, invalidAction(fmt.Sprintf("unknown action %q: move, click, mouseDown, mouseUp, drag, scroll, type, key, cursor, windows, focus, open or launch", clip(a.Action, 40)))
}

// point moves the pointer to x, y.
func point(x, y int, d *Desktop) ([]string, error) {
	if x < 0 || y < 0 || x >= d.Width || y >= d.Height {
		return nil, invalidAction(fmt.Sprintf("(%d, %d) is off the %dx%d screen", x, y, d.Width, d.Height))
	}
	return []string{"xdotool", "mousemove", "--sync", strconv.Itoa(x), strconv.Itoa(y)}, nil
}

func buttonNumber(b string) (string, error) {
	switch b {
	case "", "left":
		return "1", nil
	case "middle":
		return "2", nil
	case "right":
		return "3", nil
	}
	return "", invalidAction("button must be left, middle or right")
}

func drag(a Action, d *Desktop) ([]string, error) {
	if len(a.From) != 2 || len(a.To) != 2 {
		return nil, invalidAction("drag needs from and to, each [x, y]")
	}
	from, err := point(a.From[0], a.From[1], d)
	if err != nil {
		return nil, err
	}
	to, err := point(a.To[0], a.To[1], d)
	if err != nil {
		return nil, err
	}
	argv := append(from, "mousedown", "1")
	argv = append(argv, to[1:]...)
	return append(argv, "mouseup", "1"), nil
}

func scroll(a Action, at func() ([]string, error)) ([]string, error) {
	if a.DX == 0 && a.DY == 0 || abs(a.DX) > MaxScroll || abs(a.DY) > MaxScroll {
		return nil, invalidAction(fmt.Sprintf("scroll needs dy or dx, each at most %d clicks", MaxScroll))
	}
	argv, err := at()
	if err != nil {
		return nil, err
	}
	if argv == nil {
		argv = []string{"xdotool"}
	}
	// X's wheel: buttons 4 up, 5 down, 6 left, 7 right.
	for _, w := range []struct {
		n         int
		neg, plus string
	}{{a.DY, "4", "5"}, {a.DX, "6", "7"}} {
		if w.n != 0 {
			b := w.plus
			if w.n < 0 {
				b = w.neg
			}
			argv = append(argv, "click", "--repeat", strconv.Itoa(abs(w.n)), b)
		}
	}
	return argv, nil
}

func typeArgv(a Action) ([]string, error) {
	if a.Text == "" || !utf8.ValidString(a.Text) || utf8.RuneCountInString(a.Text) > MaxTypeText || strings.ContainsRune(a.Text, 0) {
		return nil, invalidAction(fmt.Sprintf("text must be 1 to %d characters of UTF-8, without NUL", MaxTypeText))
	}
	delay := 12 // xdotool's default
	if a.DelayMs != nil {
		if *a.DelayMs < 0 || *a.DelayMs > MaxTypeDelay {
			return nil, invalidAction(fmt.Sprintf("delayMs must be from 0 to %d", MaxTypeDelay))
		}
		delay = *a.DelayMs
	}
	return []string{"xdotool", "type", "--delay", strconv.Itoa(delay), "--", a.Text}, nil
}

func keyArgv(keys string) ([]string, error) {
	names := strings.Fields(keys)
	if len(names) == 0 || len(names) > MaxKeys {
		return nil, invalidAction(fmt.Sprintf("keys must name 1 to %d keys, space separated (xdotool's names: ctrl+l, Return, alt+Tab)", MaxKeys))
	}
	for _, k := range names {
		if len(k) > 64 || !keyName.MatchString(k) {
			return nil, invalidAction(fmt.Sprintf("%q is not a key name as xdotool has them (ctrl+l, Return, alt+Tab)", clip(k, 64)))
		}
	}
	return append([]string{"xdotool", "key", "--"}, names...), nil
}

// cursor answers the pointer's position.
func cursor(ctx context.Context, g Guest) (map[string]any, error) {
	out, err := runOnDisplay(ctx, g, []string{"xdotool", "getmouselocation", "--shell"}, 4096)
	if err != nil {
		return nil, err
	}
	pos := map[string]any{}
	for _, line := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(line, "=")
		if n, err := strconv.Atoi(v); err == nil && (k == "X" || k == "Y") {
			pos[strings.ToLower(k)] = n
		}
	}
	if len(pos) != 2 {
		return nil, errdefs.New(errdefs.ErrInternal, "desktop_failed", "the pointer's position could not be read")
	}
	return pos, nil
}

// windowsScript lists the visible windows with a name: id, then name.
const windowsScript = `for w in $(xdotool search --onlyvisible --name . 2>/dev/null); do
	printf '%s\t%s\n' "$w" "$(xdotool getwindowname "$w" 2>/dev/null | tr '\t\n' '  ')"
done`

// maxWindows bounds the windows answered.
const maxWindows = 256

// windows answers the visible windows.
func windows(ctx context.Context, g Guest) (map[string]any, error) {
	out, err := runOnDisplay(ctx, g, []string{"/bin/sh", "-c", windowsScript}, 256<<10)
	if err != nil {
		return nil, err
	}
	list := []map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		id, title, ok := strings.Cut(line, "\t")
		if !ok || !windowID.MatchString(id) || len(list) == maxWindows {
			continue
		}
		list = append(list, map[string]string{"id": id, "title": printable(clip(title, 512))})
	}
	return map[string]any{"windows": list}, nil
}

// open shows url in the browser on the desktop, starting it with a
// window if it does not run.
func (s *Service) open(ctx context.Context, id string, g Guest, d *Desktop, raw string) (map[string]any, error) {
	u, err := url.Parse(raw)
	if err != nil || len(raw) > MaxURL || !(u.Scheme == "http" || u.Scheme == "https" || u.Scheme == "file" || raw == "about:blank") {
		return nil, invalidAction("url must be an http, https or file URL, at most 8 KiB")
	}
	procs, err := processes(ctx, g)
	if err != nil {
		return nil, err
	}
	opt := BrowserOptions{Width: d.Width, Height: d.Height}
	if p := findBrowser(procs); p != nil && browserOf(p).Headless {
		return nil, errdefs.New(errdefs.ErrConflict, "browser_headless", "the sandbox's browser runs headless, off the desktop").
			WithHint("stop it (POST …/browser:stop) and open the URL again: the browser then starts on the desktop")
	} else if p == nil {
		// Started on a blank page and then handed the URL: a fresh
		// profile's first page, given on the command line, was seen to
		// stay loading for minutes under emulation.
		if _, err := s.StartBrowser(ctx, id, g, opt); err != nil {
			return nil, err
		}
	}
	// A second start of the same profile hands the URL to the running
	// browser and exits.
	if _, err := runOnDisplay(ctx, g, browserArgv(launcher{argv: []string{"chromium"}}, opt, raw), 4096); err != nil {
		return nil, err
	}
	return map[string]any{"done": true}, nil
}

// launch starts a program of the guest's image on the desktop, detached,
// as the sandbox user.
func launch(ctx context.Context, g Guest, argv []string) (map[string]any, error) {
	if len(argv) == 0 || len(argv) > MaxArgv || argv[0] == "" {
		return nil, invalidAction(fmt.Sprintf("argv must be a program and at most %d arguments", MaxArgv-1))
	}
	for _, a := range argv {
		if len(a) > MaxArg || strings.ContainsRune(a, 0) || !utf8.ValidString(a) {
			return nil, invalidAction(fmt.Sprintf("each argument must be UTF-8 without NUL, at most %d bytes", MaxArg))
		}
	}
	p, err := g.Spawn(ctx, guest.ExecRequest{Argv: argv, Detach: true, Env: map[string]string{"DISPLAY": Display}})
	if err != nil {
		return nil, err
	}
	return map[string]any{"done": true, "processId": p.ID}, nil
}

// runOnDisplay runs a command of the layer on the desktop's display and
// answers its output, or its failure as an error.
func runOnDisplay(ctx context.Context, g Guest, argv []string, maxOut int64) (string, error) {
	res, err := g.Exec(ctx, displayExec(argv, maxOut), nil)
	if err != nil {
		return "", fmt.Errorf("%s on the desktop: %w", argv[0], err)
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		return "", errdefs.New(errdefs.ErrInternal, "desktop_failed", "%s failed on the desktop: %s", argv[0],
			clip(printable(strings.TrimSpace(string(res.Stderr))), 500))
	}
	return strings.ToValidUTF8(string(res.Stdout), "?"), nil
}

func invalidAction(msg string) error {
	return errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "%s", msg)
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
