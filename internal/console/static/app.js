// Emberbox web console: a client of the HTTP API under /v1 of the origin
// that served it. No framework and no build step. The API key lives in
// sessionStorage only (gone when the tab closes) and goes out as a bearer
// header, or as a WebSocket subprotocol for the terminal, which a browser
// cannot give headers. Everything shown is built with DOM calls and
// textContent, never HTML strings, so nothing a sandbox reports can become
// markup.
"use strict";

(function () {
  const keyItem = "emberbox.key";
  const wsProtocol = "emberbox.v1";
  const wsKeyPrefix = "emberbox.key.";
  const maxUpload = 1 << 20; // PUT …/files/content takes at most 1 MiB
  const main = document.getElementById("main");
  const flashBox = document.getElementById("flash");

  // leave runs when the current view is replaced: timers, sockets.
  let leave = [];

  // el builds an element: attrs are properties ("on*" are listeners,
  // "dataset" is merged); children are nodes or strings.
  function el(tag, attrs, ...children) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
      else if (k === "dataset") Object.assign(n.dataset, v);
      else if (k === "class") n.className = v;
      else if (k in n) n[k] = v;
      else n.setAttribute(k, v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      n.append(c instanceof Node ? c : String(c));
    }
    return n;
  }

  function flash(msg, kind) {
    if (!msg) {
      flashBox.hidden = true;
      return;
    }
    flashBox.textContent = msg;
    flashBox.className = kind || "";
    flashBox.hidden = false;
  }

  function key() {
    return sessionStorage.getItem(keyItem);
  }

  function signOut() {
    sessionStorage.removeItem(keyItem);
    location.hash = "#/signin";
  }

  // APIError carries the API's error shape.
  class APIError extends Error {
    constructor(status, body) {
      const e = (body && body.error) || {};
      super((e.message || "HTTP " + status) + (e.hint ? " " + e.hint : ""));
      this.status = status;
      this.code = e.code;
    }
  }

  // api calls the API with the key; a JSON body is sent as JSON, a Blob
  // or ArrayBuffer as bytes. It answers the parsed JSON, or the Response
  // when opts.raw.
  async function api(method, path, body, opts) {
    opts = opts || {};
    const headers = Object.assign({ Authorization: "Bearer " + (opts.key || key()) }, opts.headers);
    let payload;
    if (body instanceof Blob || body instanceof ArrayBuffer) {
      payload = body;
      headers["Content-Type"] = "application/octet-stream";
    } else if (body !== undefined) {
      payload = JSON.stringify(body);
      headers["Content-Type"] = "application/json";
    }
    const resp = await fetch(path, { method, headers, body: payload, credentials: "omit", cache: "no-store" });
    if (!resp.ok) {
      let parsed = null;
      try {
        parsed = await resp.json();
      } catch (_) {
        // not the error shape
      }
      if (resp.status === 401 && !opts.key) signOut();
      throw new APIError(resp.status, parsed);
    }
    if (opts.raw) return resp;
    return resp.status === 204 ? null : resp.json();
  }

  const enc = encodeURIComponent;
  const sbPath = (id) => "/v1/sandboxes/" + enc(id);

  function when(t) {
    if (!t) return "—";
    const d = new Date(t);
    return isNaN(d) ? String(t) : d.toLocaleString();
  }

  function size(n) {
    if (n < 1024) return n + " B";
    const units = ["KiB", "MiB", "GiB", "TiB"];
    let i = -1;
    do {
      n /= 1024;
      i++;
    } while (n >= 1024 && i < units.length - 1);
    return n.toFixed(n < 10 ? 1 : 0) + " " + units[i];
  }

  function egressText(net) {
    if (!net) return "—";
    let s = net.internet ? "internet" : "off";
    if (net.allow && net.allow.length) s += ", allow " + net.allow.join(" ");
    if (net.deny && net.deny.length) s += ", deny " + net.deny.join(" ");
    if (!net.enforced) s += " (not enforced)";
    return s;
  }

  function stateBadge(state) {
    return el("span", { class: "state " + state, dataset: { state } }, state);
  }

  // ---- views ----

  function viewSignIn() {
    document.getElementById("signout").hidden = true;
    document.getElementById("who").textContent = "";
    const input = el("input", { type: "password", id: "signin-key", autocomplete: "off", placeholder: "API key", required: true });
    const form = el("form", { class: "signin", id: "signin-form" },
      el("h1", {}, "Sign in"),
      el("p", { class: "muted" }, "Paste an API key of this server (the first admin key is in the data directory's admin.key). It is kept in this tab only."),
      input,
      el("button", { type: "submit", class: "primary", id: "signin-submit" }, "Sign in"));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const k = input.value.trim();
      try {
        await api("GET", "/v1/me", undefined, { key: k });
      } catch (e) {
        flash(e.status === 401 ? "That key is not valid here." : e.message);
        return;
      }
      sessionStorage.setItem(keyItem, k);
      flash("");
      location.hash = "#/";
    });
    main.replaceChildren(form);
    input.focus();
  }

  async function viewList() {
    main.replaceChildren(el("h1", {}, "Sandboxes"));
    const num = (id, label, value, min) =>
      el("label", {}, label, el("input", { type: "number", id, name: id, min: min || 0, value: value === undefined ? "" : value, placeholder: "default" }));
    const name = el("input", { type: "text", id: "create-name", placeholder: "optional", maxLength: 63 });
    const form = el("form", { class: "inline", id: "create-form" },
      el("label", {}, "Name", name),
      num("create-vcpu", "vCPU", undefined, 1),
      num("create-memory", "Memory MiB", undefined, 64),
      num("create-disk", "Disk MiB", undefined, 256),
      num("create-timeout", "Lease (s, 0: none)", undefined, 0),
      el("button", { type: "submit", class: "primary", id: "create-submit" }, "Create sandbox"));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const body = {};
      if (name.value.trim()) body.name = name.value.trim();
      for (const [id, field] of [["create-vcpu", "vcpu"], ["create-memory", "memoryMiB"], ["create-disk", "diskMiB"], ["create-timeout", "timeoutSeconds"]]) {
        const v = document.getElementById(id).value;
        if (v !== "") body[field] = Number(v);
      }
      const btn = document.getElementById("create-submit");
      btn.disabled = true;
      try {
        const sb = await api("POST", "/v1/sandboxes", body);
        flash("Created " + sb.id + ".", "info");
        form.reset();
        await refresh();
      } catch (e) {
        flash(e.message);
      } finally {
        btn.disabled = false;
      }
    });
    const tbody = el("tbody");
    const table = el("table", { id: "sandbox-table" },
      el("thead", {}, el("tr", {}, ["Sandbox", "Name", "State", "vCPU", "Memory", "Disk", "Lease ends", "Egress", ""].map((h) => el("th", {}, h)))),
      tbody);
    main.append(form, table);

    const networks = new Map(); // id → policy, read once per sandbox and view
    async function refresh() {
      let page;
      try {
        page = await api("GET", "/v1/sandboxes?includeStopped=true&limit=100");
      } catch (e) {
        flash(e.message);
        return;
      }
      const rows = [];
      await Promise.all(page.data.filter((sb) => sb.state !== "deleted" && !networks.has(sb.id)).map(async (sb) => {
        try {
          networks.set(sb.id, await api("GET", sbPath(sb.id) + "/network"));
        } catch (_) {
          networks.set(sb.id, null);
        }
      }));
      for (const sb of page.data) {
        const actions = el("td", {});
        if (sb.state === "running" || sb.state === "paused" || sb.state === "starting") {
          actions.append(el("button", { type: "button", class: "stop", onclick: () => act(sb.id, ":stop", "Stopping") }, "Stop"));
        }
        if (sb.state === "stopped") {
          actions.append(el("button", { type: "button", class: "danger delete", onclick: () => act(sb.id, "", "Deleting", "DELETE") }, "Delete"));
        }
        rows.push(el("tr", { dataset: { id: sb.id, state: sb.state } },
          el("td", {}, el("a", { href: "#/sandboxes/" + enc(sb.id) + "/files" }, el("code", {}, sb.id))),
          el("td", {}, sb.name || el("span", { class: "muted" }, "—")),
          el("td", {}, stateBadge(sb.state)),
          el("td", { class: "num" }, sb.vcpu),
          el("td", { class: "num" }, sb.memoryMiB + " MiB"),
          el("td", { class: "num" }, sb.diskMiB + " MiB"),
          el("td", {}, sb.endsAt ? when(sb.endsAt) : el("span", { class: "muted" }, sb.persistent ? "never (persistent)" : sb.idlePauseSeconds ? "none; pauses after " + sb.idlePauseSeconds + " s idle" : "none")),
          el("td", { class: "egress" }, egressText(networks.get(sb.id))),
          actions));
      }
      if (!rows.length) rows.push(el("tr", {}, el("td", { colSpan: 9, class: "muted" }, "No sandboxes yet.")));
      tbody.replaceChildren(...rows);
    }
    async function act(id, verb, what, method) {
      flash(what + " " + id + "…", "info");
      try {
        await api(method || "POST", sbPath(id) + verb, method === "DELETE" ? undefined : {});
        await refresh();
      } catch (e) {
        flash(e.message);
      }
    }
    await refresh();
    const timer = setInterval(refresh, 3000);
    leave.push(() => clearInterval(timer));
  }

  const tabs = ["files", "terminal", "desktop", "previews", "events", "checkpoints"];

  function showState(sb) {
    document.getElementById("sandbox-state")?.replaceChildren(stateBadge(sb.state),
      el("span", { class: "muted" }, " " + sb.vcpu + " vCPU, " + sb.memoryMiB + " MiB, " + sb.diskMiB + " MiB disk"));
  }

  async function viewSandbox(id, tab, params) {
    const head = el("div", { class: "toolbar" }, el("h1", {}, "Sandbox ", el("code", {}, id)), el("span", { id: "sandbox-state" }));
    const nav = el("nav", { class: "tabs" }, tabs.map((t) =>
      el("a", { href: "#/sandboxes/" + enc(id) + "/" + t, class: t === tab ? "active" : "", id: "tab-" + t }, t[0].toUpperCase() + t.slice(1))));
    const body = el("section", { id: "tab-body" });
    main.replaceChildren(head, nav, body);
    api("GET", sbPath(id)).then(showState, (e) => flash(e.message));
    switch (tab) {
      case "files":
        return viewFiles(id, body, params.get("path") || "/workspace");
      case "terminal":
        return viewTerminal(id, body);
      case "desktop":
        return viewDesktop(id, body);
      case "previews":
        return viewPreviews(id, body);
      case "events":
        return viewEvents(id, body);
      case "checkpoints":
        return viewCheckpoints(id, body);
    }
  }

  function parentOf(p) {
    const i = p.replace(/\/+$/, "").lastIndexOf("/");
    return i <= 0 ? "/" : p.slice(0, i);
  }

  function joinPath(dir, name) {
    return dir.replace(/\/+$/, "") + "/" + name;
  }

  async function viewFiles(id, body, dir) {
    const go = (p) => { location.hash = "#/sandboxes/" + enc(id) + "/files?path=" + enc(p); };
    const pathInput = el("input", { type: "text", id: "files-path", value: dir });
    const fileInput = el("input", { type: "file", id: "upload-input" });
    const toolbar = el("form", { class: "toolbar", id: "files-form" },
      el("button", { type: "button", onclick: () => go(parentOf(dir)) }, "Up"),
      pathInput,
      el("button", { type: "submit" }, "Open"),
      fileInput,
      el("button", { type: "button", class: "primary", id: "upload-button", onclick: upload }, "Upload here"));
    toolbar.addEventListener("submit", (ev) => {
      ev.preventDefault();
      go(pathInput.value.trim() || "/workspace");
    });
    const tbody = el("tbody");
    body.append(toolbar, el("table", { id: "files-table" },
      el("thead", {}, el("tr", {}, ["Name", "Type", "Size", "Mode", "Modified", ""].map((h) => el("th", {}, h)))), tbody));

    async function upload() {
      const f = fileInput.files[0];
      if (!f) {
        flash("Choose a file first.");
        return;
      }
      if (f.size > maxUpload) {
        flash(f.name + " is larger than 1 MiB, the most one upload here takes.");
        return;
      }
      const target = joinPath(dir, f.name);
      try {
        await api("PUT", sbPath(id) + "/files/content?path=" + enc(target), f);
        flash("Uploaded " + target + ".", "info");
        fileInput.value = "";
        await list();
      } catch (e) {
        flash(e.message);
      }
    }

    async function download(entry) {
      try {
        const resp = await api("GET", sbPath(id) + "/files/content?path=" + enc(entry.path), undefined, { raw: true });
        const url = URL.createObjectURL(await resp.blob());
        const a = el("a", { href: url, download: entry.name });
        document.body.append(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(url), 60000);
      } catch (e) {
        flash(e.message);
      }
    }

    async function list() {
      let page;
      try {
        page = await api("GET", sbPath(id) + "/files/list?path=" + enc(dir) + "&hidden=true&limit=1000");
      } catch (e) {
        tbody.replaceChildren(el("tr", {}, el("td", { colSpan: 6, class: "muted" }, e.message)));
        return;
      }
      const entries = page.data.slice().sort((a, b) => (a.type === "dir") === (b.type === "dir") ? a.name.localeCompare(b.name) : a.type === "dir" ? -1 : 1);
      const rows = entries.map((e) => el("tr", { dataset: { path: e.path, type: e.type } },
        el("td", {}, e.type === "dir"
          ? el("a", { href: "#/sandboxes/" + enc(id) + "/files?path=" + enc(e.path) }, e.name + "/")
          : el("span", { class: "mono" }, e.name)),
        el("td", {}, e.type + (e.symlinkTarget ? " → " + e.symlinkTarget : "")),
        el("td", { class: "num" }, e.type === "file" ? size(e.size) : ""),
        el("td", { class: "mono" }, e.mode),
        el("td", {}, when(e.modifiedAt)),
        el("td", {}, e.type === "file" ? el("button", { type: "button", class: "download", dataset: { path: e.path }, onclick: () => download(e) }, "Download") : "")));
      if (!rows.length) rows.push(el("tr", {}, el("td", { colSpan: 6, class: "muted" }, "Empty directory.")));
      tbody.replaceChildren(...rows);
    }
    await list();
  }

  function viewTerminal(id, body) {
    const status = el("div", { id: "terminal-status" }, "Connecting…");
    const box = el("div", { id: "terminal" });
    body.append(status, box);
    if (!window.Terminal || !window.FitAddon) {
      status.textContent = "xterm.js did not load.";
      return;
    }
    const term = new window.Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, convertEol: false });
    const fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    const b64 = btoa(key()).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = scheme + "//" + location.host + sbPath(id) + "/terminal?cols=" + term.cols + "&rows=" + term.rows;
    const ws = new WebSocket(url, [wsProtocol, wsKeyPrefix + b64]);
    ws.binaryType = "arraybuffer";
    const encoder = new TextEncoder();
    let ended = false;
    ws.onmessage = (ev) => {
      if (typeof ev.data !== "string") {
        term.write(new Uint8Array(ev.data));
        return;
      }
      let m;
      try {
        m = JSON.parse(ev.data);
      } catch (_) {
        return;
      }
      if (m.type === "ready") {
        status.textContent = "Connected: process " + m.processId;
        box.dataset.processId = m.processId;
        term.focus();
      } else if (m.type === "exit") {
        ended = true;
        status.textContent = "The shell exited (code " + m.exitCode + ").";
      } else if (m.type === "error" && m.error) {
        status.textContent = "Error: " + m.error.message;
      }
    };
    ws.onclose = (ev) => {
      if (!ended) status.textContent = "Disconnected" + (ev.code === 1006 ? " (refused or lost; is the sandbox running?)" : " (" + ev.code + ")") + ".";
    };
    term.onData((s) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(s));
    });
    term.onBinary((s) => {
      if (ws.readyState !== WebSocket.OPEN) return;
      const b = new Uint8Array(s.length);
      for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i) & 0xff;
      ws.send(b);
    });
    term.onResize(({ cols, rows }) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", cols, rows }));
    });
    const onResize = () => fit.fit();
    window.addEventListener("resize", onResize);
    // The shell keeps running when the view is left; only the socket goes.
    leave.push(() => {
      window.removeEventListener("resize", onResize);
      ws.close(1000, "left");
      term.dispose();
    });
    // Tests and the curious can read what the terminal shows.
    window.emberboxTerminalText = () => {
      const buf = term.buffer.active;
      const lines = [];
      for (let i = 0; i < buf.length; i++) lines.push(buf.getLine(i).translateToString(true));
      return lines.join("\n");
    };
  }

  // The desktop: start and stop it, open a URL in its browser, and watch
  // it live in a frame of its streamUrl (noVNC, on the view's own origin).
  async function viewDesktop(id, body) {
    const url = el("input", { type: "url", id: "desktop-url", placeholder: "http://127.0.0.1:8000/", required: true });
    const startBtn = el("button", { type: "button", class: "primary", id: "desktop-start" }, "Start desktop");
    const stopBtn = el("button", { type: "button", class: "danger", id: "desktop-stop" }, "Stop desktop");
    const openForm = el("form", { class: "inline", id: "desktop-open" }, el("label", {}, "Open", url),
      el("button", { type: "submit", id: "desktop-open-submit" }, "Open in the browser"));
    const info = el("p", { class: "muted", id: "desktop-info" });
    const view = el("div", { id: "desktop-view" });
    body.append(el("div", { class: "toolbar" }, startBtn, stopBtn), openForm, info, view);
    function show(d) {
      startBtn.disabled = d.running;
      stopBtn.disabled = !d.running;
      openForm.hidden = !d.running;
      info.textContent = d.running ? d.width + "×" + d.height + ", DISPLAY=" + d.display + " inside the sandbox, since " + when(d.startedAt) : "The desktop is not running.";
      if (d.running && d.streamUrl) {
        const frame = el("iframe", { id: "desktop-frame", src: d.streamUrl, title: "Live desktop", allow: "clipboard-read; clipboard-write" });
        view.replaceChildren(frame);
      } else {
        view.replaceChildren();
      }
    }
    async function run(fn) {
      try {
        show(await fn());
      } catch (e) {
        flash(e.message);
      }
    }
    startBtn.addEventListener("click", () => {
      info.textContent = "Starting the desktop…";
      run(() => api("POST", sbPath(id) + "/desktop:start", {}));
    });
    stopBtn.addEventListener("click", () => run(async () => {
      await api("POST", sbPath(id) + "/desktop:stop", {});
      return api("GET", sbPath(id) + "/desktop");
    }));
    openForm.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        await api("POST", sbPath(id) + "/desktop:act", { action: "open", url: url.value });
      } catch (e) {
        flash(e.message);
      }
    });
    await run(() => api("GET", sbPath(id) + "/desktop"));
  }

  async function viewPreviews(id, body) {
    const port = el("input", { type: "number", id: "preview-port", min: 1, max: 65535, required: true, placeholder: "8000" });
    const vis = el("select", { id: "preview-visibility" }, el("option", { value: "private" }, "private (token)"), el("option", { value: "public" }, "public"));
    const form = el("form", { class: "inline", id: "preview-form" },
      el("label", {}, "Port", port), el("label", {}, "Visibility", vis),
      el("button", { type: "submit", class: "primary", id: "preview-submit" }, "Share port"));
    const tbody = el("tbody");
    body.append(form, el("table", { id: "previews-table" },
      el("thead", {}, el("tr", {}, ["Port", "Visibility", "URL", "Token expires", ""].map((h) => el("th", {}, h)))), tbody));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        await api("POST", sbPath(id) + "/previews", { port: Number(port.value), visibility: vis.value });
        form.reset();
        await list();
      } catch (e) {
        flash(e.message);
      }
    });
    async function list() {
      let page;
      try {
        page = await api("GET", sbPath(id) + "/previews");
      } catch (e) {
        tbody.replaceChildren(el("tr", {}, el("td", { colSpan: 5, class: "muted" }, e.message)));
        return;
      }
      const rows = page.data.map((p) => el("tr", { dataset: { port: p.port } },
        el("td", { class: "num" }, p.port),
        el("td", {}, p.visibility),
        el("td", { class: "mono" }, p.url),
        el("td", {}, when(p.tokenExpiresAt)),
        el("td", {},
          el("a", { href: p.urlWithToken || p.url, target: "_blank", rel: "noopener noreferrer" }, "Open"), " ",
          el("button", { type: "button", class: "danger", onclick: async () => {
            try {
              await api("DELETE", sbPath(id) + "/previews/" + p.port);
              await list();
            } catch (e) {
              flash(e.message);
            }
          } }, "Stop sharing"))));
      if (!rows.length) rows.push(el("tr", {}, el("td", { colSpan: 5, class: "muted" }, "No port is shared.")));
      tbody.replaceChildren(...rows);
    }
    await list();
  }

  async function viewEvents(id, body) {
    const tbody = el("tbody");
    body.append(el("table", { id: "events-table" },
      el("thead", {}, el("tr", {}, ["When", "Type", "Message"].map((h) => el("th", {}, h)))), tbody));
    async function list() {
      let page;
      try {
        page = await api("GET", sbPath(id) + "/events?limit=200");
      } catch (e) {
        tbody.replaceChildren(el("tr", {}, el("td", { colSpan: 3, class: "muted" }, e.message)));
        return;
      }
      const rows = page.data.slice().reverse().map((ev) => el("tr", { dataset: { type: ev.type } },
        el("td", {}, when(ev.at)), el("td", {}, el("code", {}, ev.type)), el("td", {}, ev.message)));
      if (!rows.length) rows.push(el("tr", {}, el("td", { colSpan: 3, class: "muted" }, "No events.")));
      tbody.replaceChildren(...rows);
    }
    await list();
    const timer = setInterval(list, 5000);
    leave.push(() => clearInterval(timer));
  }

  // viewCheckpoints shows a sandbox's checkpoints as a timeline, oldest
  // first, each with Restore (after a confirm), Branch and Delete; the form
  // takes a new one. Those calls answer only once the work is done, so
  // every button is off meanwhile.
  async function viewCheckpoints(id, body) {
    const ckPath = (cid) => sbPath(id) + "/checkpoints" + (cid ? "/" + enc(cid) : "");
    const label = el("input", { type: "text", id: "checkpoint-label", placeholder: "optional", maxLength: 63 });
    const keep = el("input", { type: "checkbox", id: "restore-keep" });
    const form = el("form", { class: "inline", id: "checkpoint-form" },
      el("label", {}, "Label", label),
      el("button", { type: "submit", class: "primary", id: "checkpoint-submit" }, "Checkpoint now"),
      el("label", { class: "check" }, keep, "On restore, keep the present state as a checkpoint"));
    const result = el("p", { id: "checkpoint-result" });
    const timeline = el("ol", { class: "timeline", id: "checkpoint-timeline" });
    body.append(form, result, timeline);
    const nameOf = (ck) => ck.label ? "“" + ck.label + "”" : ck.id;
    let busy = false;

    async function run(what, fn) {
      if (busy) return;
      busy = true;
      const buttons = body.querySelectorAll("button");
      buttons.forEach((b) => { b.disabled = true; });
      flash(what + "…", "info");
      try {
        flash(await fn(), "info");
      } catch (e) {
        flash(e.message);
      } finally {
        busy = false;
        buttons.forEach((b) => { b.disabled = false; });
        await list();
      }
    }

    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const req = label.value.trim() ? { label: label.value.trim() } : {};
      run("Taking a checkpoint of " + id, async () => {
        const ck = await api("POST", ckPath(), req);
        label.value = "";
        if (ck.state === "failed") throw new Error("The checkpoint failed: " + (ck.error || "no reason given") + ".");
        return "Took checkpoint " + nameOf(ck) + " (" + size(ck.sizeBytes) + ").";
      });
    });

    function restore(ck) {
      const lost = keep.checked ? "The present state is checkpointed first (before-restore)."
        : "Everything it did since then is lost: memory, processes and disk go back to that moment.";
      if (!confirm("Restore " + id + " to " + nameOf(ck) + " of " + when(ck.createdAt) + "?\n\n" + lost)) return;
      run("Restoring " + id + " to " + nameOf(ck), async () => {
        const sb = await api("POST", ckPath(ck.id) + ":restore", { keep: keep.checked });
        showState(sb);
        return "Restored " + id + " to " + nameOf(ck) + "; it is " + sb.state + ".";
      });
    }

    function branch(ck) {
      const answer = prompt("How many new sandboxes to start from " + nameOf(ck) + "? (1 to 10)", "1");
      if (answer === null) return;
      const count = Number(answer);
      if (!Number.isInteger(count) || count < 1 || count > 10) {
        flash("Branch: want a whole number from 1 to 10.");
        return;
      }
      run("Starting " + count + " sandbox" + (count > 1 ? "es" : "") + " from " + nameOf(ck), async () => {
        const out = await api("POST", ckPath(ck.id) + ":branch", { count });
        result.replaceChildren("Branched from " + nameOf(ck) + ": ", ...out.sandboxes.flatMap((sb, i) =>
          [i ? ", " : "", el("a", { href: "#/sandboxes/" + enc(sb.id) + "/files" }, el("code", {}, sb.id))]));
        return "Started " + out.sandboxes.map((sb) => sb.id).join(", ") + ".";
      });
    }

    function del(ck) {
      if (!confirm("Delete checkpoint " + nameOf(ck) + " of " + id + "?")) return;
      run("Deleting " + nameOf(ck), async () => {
        await api("DELETE", ckPath(ck.id));
        return "Deleted checkpoint " + nameOf(ck) + ".";
      });
    }

    const item = (ck) => el("li", { class: "checkpoint " + ck.state, dataset: { id: ck.id, state: ck.state } },
      el("div", {}, ck.label ? el("strong", {}, ck.label) : el("span", { class: "muted" }, "no label"), " ",
        el("code", { class: "muted" }, ck.id), ck.state !== "ready" ? [" ", stateBadge(ck.state)] : null),
      el("div", { class: "muted" }, when(ck.createdAt) + " · " + size(ck.sizeBytes || 0) + (ck.error ? " · " + ck.error : "")),
      el("div", { class: "actions" },
        ck.state === "ready" ? [
          el("button", { type: "button", class: "restore", onclick: () => restore(ck) }, "Restore"),
          el("button", { type: "button", class: "branch", onclick: () => branch(ck) }, "Branch")] : null,
        ck.state !== "capturing" ? el("button", { type: "button", class: "danger delete", onclick: () => del(ck) }, "Delete") : null));

    async function list() {
      let page;
      try {
        page = await api("GET", ckPath());
      } catch (e) {
        timeline.replaceChildren(el("li", { class: "muted empty" }, e.message));
        return;
      }
      const items = page.checkpoints.slice().sort((a, b) => new Date(a.createdAt) - new Date(b.createdAt)).map(item);
      if (!items.length) items.push(el("li", { class: "muted empty" }, "No checkpoints yet."));
      timeline.replaceChildren(...items);
    }
    await list();
    const timer = setInterval(() => {
      if (!busy) list();
    }, 5000);
    leave.push(() => clearInterval(timer));
  }

  // ---- routing: #/signin, #/, #/sandboxes/<id>/<tab>[?path=…] ----

  async function route() {
    for (const f of leave) f();
    leave = [];
    const [path, query] = location.hash.replace(/^#/, "").split("?");
    const params = new URLSearchParams(query || "");
    if (!key()) {
      if (path !== "/signin") location.hash = "#/signin";
      else viewSignIn();
      return;
    }
    document.getElementById("signout").hidden = false;
    const who = document.getElementById("who");
    if (!who.textContent) {
      api("GET", "/v1/me").then((me) => {
        who.textContent = (me.keyName || me.keyId || "") + (me.role ? " (" + me.role + ")" : "");
      }, () => {});
    }
    document.getElementById("nav").replaceChildren(el("a", { href: "#/" }, "Sandboxes"));
    const m = /^\/sandboxes\/([^/]+)\/(\w+)$/.exec(path || "");
    try {
      if (m && tabs.includes(m[2])) await viewSandbox(decodeURIComponent(m[1]), m[2], params);
      else if (path === "/signin" || path === "/" || !path) await viewList();
      else location.hash = "#/";
    } catch (e) {
      flash(e.message);
    }
  }

  document.getElementById("signout").addEventListener("click", signOut);
  window.addEventListener("hashchange", () => {
    flash("");
    route();
  });
  route();
})();
