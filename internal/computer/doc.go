// Package computer runs the software of computer use inside a sandbox: a
// Chromium that agents drive over the Chrome DevTools Protocol (CDP).
//
// It keeps no state of its own. The browser is a process of the guest,
// started through the guest's process API and found again in the guest's
// process list by its command line, which also records how it was started
// (headless, window size). So a restart of the server, a pause and wake
// (the VM's memory is saved whole: the browser, its pages and its CDP
// sessions' targets survive; the connections to it do not), or a move to
// another node finds the browser where it was, and a stop of the sandbox
// ends it.
//
//   - Software: the default image carries Chromium (internal/guestimage),
//     in the read-only base disk every default sandbox shares through its
//     overlay; nothing is downloaded or copied per sandbox. A sandbox of a
//     custom image without a Chromium gets one installed on its first start
//     by the image's package manager (apt-get, apk or dnf, through the
//     sandbox's egress): the start answers 503 browser_installing with
//     retryAfterMs until the install ends, and a failed install answers
//     browser_install_failed with its log's tail (a minute later a start
//     tries again).
//   - The browser: `chromium --remote-debugging-port=9222` on 127.0.0.1, as
//     the sandbox user, with its profile in /tmp/emberbox-browser (kept
//     across stops of the browser, so logins stay). Inside the sandbox it is
//     at http://127.0.0.1:9222. One per sandbox: a start while one runs
//     answers the running one. Its traffic leaves through the sandbox's
//     egress like any other process's.
//   - Outside, the API (internal/api) answers a cdpUrl on the private
//     preview of port 9222, an origin of its own reached over the guest
//     stream; this package answers the DevTools path the URL ends with.
//     Everything the guest's DevTools endpoint answers is bounded and
//     checked here.
package computer
