package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/input"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// chromiumPath finds Debian's chromium, which scripts/deps.sh installs;
// nothing here downloads a browser.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("EMBERBOX_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Fatal("the console test needs a Chromium: install Debian's chromium (scripts/deps.sh does, or apt-get install -y chromium), or set EMBERBOX_CHROMIUM")
	return ""
}

// TestConsole drives the web console in a headless Chromium against a real
// server and VM: sign in, create a sandbox, type into its terminal, upload
// and download a file, read its events, stop it. It takes a screenshot of
// each page into $EMBERBOX_SCREENSHOTS, or a temporary directory.
func TestConsole(t *testing.T) {
	needVMs(t)
	chromium := chromiumPath(t)
	s := startServer(t, t.TempDir())
	c := s.client(s.AdminKey)

	// The page and its assets come with the strict policy.
	resp, err := http.Get(s.URL + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("GET /console/: %d, CSP %q", resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
	}

	shots := os.Getenv("EMBERBOX_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	downloads := t.TempDir()

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1280, 820),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("disable-gpu", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	defer cancelBrowser()
	// The first action starts the browser, which lives as long as the
	// context of that call: no timeout on it.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting %s: %v", chromium, err)
	}

	// What the page reports: CSP violations and uncaught errors fail the test.
	var pageMu sync.Mutex
	var pageErrors []string
	hostileOpen := false // the hostile preview's page is shown: its errors are its own
	hostilePage := func(open bool) {
		pageMu.Lock()
		hostileOpen = open
		pageMu.Unlock()
	}
	err = chromedp.Listen(ctx, func(ev any) {
		var msg, from string
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			from = e.ExceptionDetails.URL
			msg = "exception: " + e.ExceptionDetails.Text
			if e.ExceptionDetails.Exception != nil {
				msg += " " + e.ExceptionDetails.Exception.Description
			}
		case *cdplog.EventEntryAdded:
			from = e.Entry.URL
			if e.Entry.Level == cdplog.EntryLevelError || strings.Contains(e.Entry.Text, "Content Security Policy") {
				msg = "log: " + e.Entry.Text
			}
		}
		if msg != "" {
			pageMu.Lock()
			// Only previews live under .localhost here.
			if !hostileOpen && !strings.Contains(from, ".localhost:") {
				pageErrors = append(pageErrors, msg+" ("+from+")")
			}
			pageMu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()

	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	shot := func(name string) {
		t.Helper()
		run("settle before "+name, chromedp.Sleep(300*time.Millisecond))
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		p := filepath.Join(shots, name+".png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}
	eval := func(what, expr string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
	// waitJS polls a JavaScript expression until it is true.
	waitJS := func(what, expr string, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+expr+")"))
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				page := eval("read the page", `document.getElementById("main").innerText + "\n" + document.getElementById("flash").innerText`)
				t.Fatalf("%s: not so after %s; the page shows:\n%s", what, timeout, page)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	setDownloads := chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Call(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
			Behavior: browser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: downloads, EventsEnabled: &[]bool{true}[0]})
		return err
	})
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }

	// Sign in.
	run("open the console", setDownloads, chromedp.Navigate(s.URL+"/console/"), chromedp.WaitVisible(css("#signin-key")))
	shot("1-signin")
	run("sign in", chromedp.SendKeys(css("#signin-key"), s.AdminKey), chromedp.Click(css("#signin-submit")),
		chromedp.WaitVisible(css("#create-form")))
	stored := eval("read the stored key", `sessionStorage.getItem("emberbox.key") + "|" + localStorage.length + "|" + document.cookie`)
	if stored != s.AdminKey+"|0|" {
		t.Fatalf("the key is kept as %q; want it in sessionStorage only", stored)
	}

	// Create a sandbox from the list page and see it run.
	run("create", chromedp.SendKeys(css("#create-name"), "console-e2e"), chromedp.Click(css("#create-submit")))
	waitJS("the new sandbox is listed", `!!document.querySelector("#sandbox-table tr[data-id]")`, 2*time.Minute)
	id := eval("read its id", `document.querySelector("#sandbox-table tr[data-id]").dataset.id`)
	s.tr.add(id, s.AdminKey) // the cleanup deletes it
	waitJS("it runs", fmt.Sprintf(`document.querySelector('#sandbox-table tr[data-id=%q]')?.dataset.state === "running"`, id), 5*time.Minute)
	waitJS("its egress policy is shown", fmt.Sprintf(`document.querySelector('#sandbox-table tr[data-id=%q] td.egress')?.textContent.startsWith("internet")`, id), time.Minute)
	if sb := c.get(t, id); sb.State != "running" {
		t.Fatalf("the API has %+v", sb)
	}
	shot("2-sandboxes")

	// The terminal: type a command and see what it printed.
	run("open the terminal", chromedp.Navigate(s.URL+"/console/#/sandboxes/"+id+"/terminal"),
		chromedp.WaitVisible(css("#terminal[data-process-id]")))
	// The terminal takes the focus once it is attached; keys go to it.
	waitJS("the terminal has the focus", `document.activeElement && document.activeElement.classList.contains("xterm-helper-textarea")`, time.Minute)
	run("type", typeKeys("echo hi-$((6*7))\r"))
	waitJS("hi-42 shows in the terminal", `window.emberboxTerminalText().includes("hi-42")`, 2*time.Minute)
	shot("3-terminal")

	// Upload through the files view; the API reads it back.
	upload := []byte("uploaded through the console\n\x00\xff binary tail\n")
	local := filepath.Join(t.TempDir(), "from-browser.bin")
	if err := os.WriteFile(local, upload, 0o644); err != nil {
		t.Fatal(err)
	}
	run("open the files", chromedp.Navigate(s.URL+"/console/#/sandboxes/"+id+"/files?path=/workspace"),
		chromedp.WaitVisible(css("#files-table")))
	run("upload", chromedp.SetUploadFiles(css("#upload-input"), []string{local}), chromedp.Click(css("#upload-button")))
	waitJS("the upload is listed", `!!document.querySelector('#files-table tr[data-path="/workspace/from-browser.bin"]')`, 2*time.Minute)
	if got, _ := c.readFile(t, id, "/workspace/from-browser.bin"); !bytes.Equal(got, upload) {
		t.Fatalf("the API reads %q, the browser sent %q", got, upload)
	}

	// Download through the files view; the bytes match what the API wrote.
	want := make([]byte, 200<<10)
	_, _ = rand.Read(want)
	c.writeFile(t, id, "/workspace/to-browser.bin", want)
	run("reopen the files", chromedp.Navigate(s.URL+"/console/#/sandboxes/"+id+"/files?path=/workspace/"),
		chromedp.WaitVisible(css(`#files-table button.download[data-path="/workspace/to-browser.bin"]`)))
	shot("4-files")
	run("download", chromedp.Click(css(`#files-table button.download[data-path="/workspace/to-browser.bin"]`)))
	// Chromium names the finished file by its download's GUID.
	if !waitUntil(2*time.Minute, 200*time.Millisecond, func() bool {
		ents, _ := os.ReadDir(downloads)
		for _, e := range ents {
			if got, err := os.ReadFile(filepath.Join(downloads, e.Name())); err == nil && bytes.Equal(got, want) {
				return true
			}
		}
		return false
	}) {
		ents, _ := os.ReadDir(downloads)
		var names []string
		for _, e := range ents {
			fi, _ := e.Info()
			names = append(names, fmt.Sprintf("%s (%d bytes)", e.Name(), fi.Size()))
		}
		t.Fatalf("no download of the %d bytes written arrived in %s; it holds %v", len(want), downloads, names)
	}

	// Previews: a hostile server behind a public preview, on an origin of
	// its own, gets nothing of the console's.
	c.writeFile(t, id, "/workspace/hostile.py", []byte(hostileGuest))
	c.spawn(t, id, "python3 /workspace/hostile.py 8000")
	run("open the previews", chromedp.Navigate(s.URL+"/console/#/sandboxes/"+id+"/previews"),
		chromedp.WaitVisible(css("#previews-table")))
	run("share a port publicly", chromedp.SendKeys(css("#preview-port"), "8000"),
		chromedp.SetValue(css("#preview-visibility"), "public"), chromedp.Click(css("#preview-submit")))
	waitJS("the preview is listed", `document.querySelector('#previews-table tr[data-port="8000"] a[href*=".localhost:"]')`, time.Minute)
	link := eval("read the preview link", `document.querySelector('#previews-table tr[data-port="8000"] a').href`)
	previewOrigin := "http://8000-" + strings.TrimPrefix(id, "sbx_") + ".localhost:" + strings.TrimPrefix(s.URL[strings.LastIndexByte(s.URL, ':'):], ":")
	if link != previewOrigin+"/" {
		t.Fatalf("the preview link is %s, want %s/", link, previewOrigin)
	}
	shot("5-previews")
	// A program that sends our credentials to the preview: it is served,
	// and the guest sees none of them (checked below, with the rest).
	if !waitUntil(time.Minute, 500*time.Millisecond, func() bool {
		req, _ := http.NewRequest("GET", link+"from-a-program", nil)
		for _, h := range []string{"Authorization", "X-Api-Key", "X-Access-Token", "X-Runtime-Preview-Token"} {
			req.Header.Set(h, "Bearer "+s.AdminKey)
		}
		resp, err := previewClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatalf("the preview %s does not answer 200", link)
	}
	// The hostile page, opened in the console's own tab: what it reports
	// is asserted here; the errors it provokes are its own, not the
	// console's.
	hostilePage(true)
	run("open the hostile preview", chromedp.Navigate(link+"?api="+s.URL))
	var found struct{ Origin, Session, Local, Cookie, SW, APISW, APIFetch string }
	if !waitUntil(2*time.Minute, 300*time.Millisecond, func() bool {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.hostile ? JSON.stringify(window.hostile) : ""`))
		return err == nil && v != "" && json.Unmarshal([]byte(v), &found) == nil
	}) {
		t.Fatal("the hostile page reported nothing in 2 minutes")
	}
	t.Logf("the hostile page found %+v", found)
	if found.Origin != previewOrigin || found.SW != previewOrigin+"/" {
		t.Errorf("the hostile page ran at %q with a worker for %q; want both at %s", found.Origin, found.SW, previewOrigin)
	}
	if strings.Contains(found.Session+found.Local+found.Cookie+found.APIFetch, s.AdminKey) || found.Session != "{}" || found.Local != "{}" || found.Cookie != "" {
		t.Errorf("the hostile page read the console's storage or cookies: %+v", found)
	}
	if !strings.HasPrefix(found.APISW, "refused") || strings.HasPrefix(found.APIFetch, "200") {
		t.Errorf("the hostile page reached the API's origin: worker %q, fetch %q", found.APISW, found.APIFetch)
	}
	// Its worker is live on its own origin: it sees a reload there...
	run("reload the hostile preview", chromedp.Navigate(link+"again?api="+s.URL))
	hostileLog := func() []map[string]any {
		data, _ := c.readFile(t, id, "/workspace/hostile.log")
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil {
				out = append(out, m)
			}
		}
		return out
	}
	sawOwn := func() bool {
		for _, e := range hostileLog() {
			if body, _ := e["body"].(string); e["kind"] == "seen" && strings.Contains(body, link+"again") {
				return true
			}
		}
		return false
	}
	if !waitUntil(time.Minute, 500*time.Millisecond, sawOwn) {
		t.Fatalf("the hostile worker never reported a fetch of its own origin: %v", hostileLog())
	}
	// ...and none of the console's requests, which carry the key.
	run("back to the console", chromedp.Navigate(s.URL+"/console/#/sandboxes/"+id+"/previews"),
		chromedp.WaitVisible(css(`#previews-table tr[data-port="8000"]`)))
	hostilePage(false)
	entries := hostileLog()
	for _, e := range entries {
		raw, _ := json.Marshal(e)
		if strings.Contains(string(raw), s.AdminKey) {
			t.Errorf("the hostile guest got the console's key: %s", raw)
		}
		// The worker sees the hostile page's own requests, its try at the
		// API included (marked from=hostile); any other request of another
		// origin would be the console's.
		if body, _ := e["body"].(string); e["kind"] == "seen" && !strings.Contains(body, `"url":"`+previewOrigin+"/") &&
			!strings.Contains(body, `"url":"`+s.URL+"/v1/sandboxes?from=hostile\"") {
			t.Errorf("the hostile worker saw a request of another origin: %s", body)
		}
		if hdrs, ok := e["headers"].(map[string]any); ok {
			for k := range hdrs {
				switch strings.ToLower(k) {
				case "authorization", "x-api-key", "x-access-token", "x-runtime-preview-token":
					t.Errorf("the hostile guest got %s: %s", k, raw)
				}
			}
		}
	}
	if !slices.ContainsFunc(entries, func(e map[string]any) bool { return e["path"] == "/from-a-program" }) {
		t.Errorf("the program's request is not in the guest's log: %v", entries)
	}
	shot("6-hostile-preview")
	run("open the events", chromedp.Navigate(s.URL+"/console/#/sandboxes/"+id+"/events"),
		chromedp.WaitVisible(css("#events-table")))
	waitJS("its events are listed", `!!document.querySelector('#events-table tr[data-type="created"]')`, time.Minute)
	shot("7-events")

	// The desktop, live: started from its tab, a page opened in its
	// browser, watched through noVNC in a frame of the view's own origin.
	consoleDesktop(t, c, id, run, waitJS, eval)
	run("open the desktop tab", chromedp.Navigate(s.URL+"/console/#/sandboxes/"+id+"/desktop"),
		chromedp.WaitVisible(css("#desktop-frame")))
	// The frame's own view connects (x11vnc's port has an established
	// connection), and the picture is drawn before the screenshot.
	waitVNCClients(t, c, id, 2)
	run("let the frame draw", chromedp.Sleep(3*time.Second))
	shot("8-desktop")

	// Stop it from the list.
	run("back to the list", chromedp.Navigate(s.URL+"/console/#/"),
		chromedp.WaitVisible(css(fmt.Sprintf(`#sandbox-table tr[data-id=%q] button.stop`, id))),
		chromedp.Click(css(fmt.Sprintf(`#sandbox-table tr[data-id=%q] button.stop`, id))))
	waitJS("it stops", fmt.Sprintf(`document.querySelector('#sandbox-table tr[data-id=%q]')?.dataset.state === "stopped"`, id), 5*time.Minute)
	if sb := c.get(t, id); sb.State != "stopped" {
		t.Fatalf("the API has it %s", sb.State)
	}

	pageMu.Lock()
	defer pageMu.Unlock()
	var bad []string
	for _, m := range pageErrors {
		// A refused request is logged by the browser as well as shown.
		if !strings.Contains(m, "Failed to load resource") {
			bad = append(bad, m)
		}
	}
	if len(bad) > 0 {
		t.Fatal(errors.New("the page reported:\n" + strings.Join(bad, "\n")))
	}
}

// typeKeys presses a key for each character as a keyboard does: one
// keyDown carrying its text, then keyUp ("\r" is Enter). chromedp's
// KeyEvent also sends a char event, which xterm.js takes as a second copy.
func typeKeys(text string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		for _, r := range text {
			down := input.DispatchKeyEventParams{Type: input.DispatchKeyEventTypeKeyDown, Text: string(r), Key: string(r)}
			if r == '\r' {
				down.Key, down.Code, down.WindowsVirtualKeyCode = "Enter", "Enter", 13
			}
			up := down
			up.Type, up.Text = input.DispatchKeyEventTypeKeyUp, ""
			for _, ev := range []input.DispatchKeyEventParams{down, up} {
				if _, err := chromedp.Call(ctx, input.DispatchKeyEvent, ev); err != nil {
					return fmt.Errorf("key %q: %w", r, err)
				}
			}
		}
		return nil
	})
}

// consoleDesktop starts the desktop from the console's desktop tab, opens a
// page in its browser from there, and checks the live view page itself (in
// the top frame, where its status can be read) connects to the desktop.
func consoleDesktop(t *testing.T, c *client, id string, run func(string, ...chromedp.Action[chromedp.Void]),
	waitJS func(string, string, time.Duration), eval func(string, string) string) {
	t.Helper()
	c.writeFile(t, id, "/workspace/live/index.html", []byte("<title>Live from Emberbox</title><h1 style='font-size:64px'>Live from Emberbox</h1>"))
	c.spawn(t, id, "python3 -m http.server 8001 --bind 127.0.0.1 --directory /workspace/live")
	run("open the desktop tab", chromedp.Navigate(c.s.URL+"/console/#/sandboxes/"+id+"/desktop"),
		chromedp.WaitVisible(chromedp.CSS("#desktop-start")))
	run("start the desktop", chromedp.Click(chromedp.CSS("#desktop-start")))
	waitJS("the live view is framed", `document.querySelector('#desktop-frame')?.src.includes('5900-')`, 5*time.Minute)
	stream := eval("read the stream URL", `document.querySelector('#desktop-frame').src`)
	run("open a page on the desktop", chromedp.SendKeys(chromedp.CSS("#desktop-url"), "http://127.0.0.1:8001/"),
		chromedp.Click(chromedp.CSS("#desktop-open-submit")))
	if !waitUntil(5*time.Minute, time.Second, func() bool {
		var out struct {
			Windows []struct{ Title string } `json:"windows"`
		}
		r := c.raw(t, "POST", "/v1/sandboxes/"+id+"/desktop:act", []byte(`{"action":"windows"}`), nil, requestTimeout)
		return r.err == nil && json.Unmarshal(r.Body, &out) == nil &&
			slices.ContainsFunc(out.Windows, func(w struct{ Title string }) bool { return strings.Contains(w.Title, "Live from Emberbox") })
	}) {
		t.Fatal("the page opened from the console never showed on the desktop")
	}
	// The view itself, as the top page: noVNC says it is live once the
	// RFB handshake with the desktop's VNC server is done.
	run("open the live view", chromedp.Navigate(stream), chromedp.WaitVisible(chromedp.CSS("#screen canvas")))
	waitJS("the live view connects", `document.getElementById('status').textContent.startsWith('live')`, 3*time.Minute)
	// Without its token the page and its socket are refused.
	bare := stream[:strings.IndexByte(stream, '?')]
	for _, u := range []string{bare, bare + "websockify"} {
		resp, err := previewClient.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without its token: %d, want 401", u, resp.StatusCode)
		}
	}
}

// waitVNCClients waits until the desktop's VNC server has n connections.
func waitVNCClients(t *testing.T, c *client, id string, n int) {
	t.Helper()
	cmd := "ss -Htn state established '( sport = :5900 )' | wc -l"
	if !waitUntil(3*time.Minute, time.Second, func() bool {
		res, _ := c.exec(t, id, execReq{Command: cmd, TimeoutMs: 30_000})
		got, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
		return got >= n
	}) {
		res, _ := c.exec(t, id, execReq{Command: "ss -tnp; ps aux | grep -c x11vnc", TimeoutMs: 30_000})
		t.Fatalf("the VNC server never had %d connections: %s", n, res.Stdout)
	}
}
