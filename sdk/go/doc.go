// Package emberbox is a Go client of an Emberbox server: microVM sandboxes for
// AI agents, over the Runtime Cloud API.
//
// A Client is made with the server's origin and an API key. Each call takes a
// context and returns typed values; an answer of the server that is an error is
// an *APIError (use errors.As), carrying the server's code, status, message,
// hint and request id. Calls are retried the way the Python SDK retries them:
// transport errors and 429/502/503/504 answers, up to MaxRetries times, waiting
// as the server's Retry-After says or with exponential backoff. Every call but
// a GET carries an Idempotency-Key that stays the same across its retries, so a
// retried create makes one sandbox.
//
// Exec streams a command's output to writers as it comes and returns its exit
// status; Terminal opens an interactive terminal over a WebSocket. Files go
// through ReadFile and WriteFile, directories through DownloadArchive and
// UploadArchive (tar.gz). Checkpoint takes a checkpoint of a sandbox (its
// memory, processes and disk); RestoreCheckpoint rolls the sandbox back to one
// and BranchCheckpoint starts new sandboxes from one. CreateWebhook and its
// siblings send the key's events to a URL, signed; ListAccountEvents reads the
// same feed for a program that would rather poll. SetEgressSecret stores a
// credential that sandboxes use through a placeholder, never seeing it; no
// answer carries its value.
//
//	c, err := emberbox.NewClient("http://127.0.0.1:8080", os.Getenv("EMBERBOX_API_KEY"))
//	if err != nil {
//		return err
//	}
//	sb, err := c.Create(ctx, emberbox.CreateRequest{Name: "demo", VCPU: 1, MemoryMiB: 512})
//	if err != nil {
//		return err
//	}
//	defer c.Delete(context.WithoutCancel(ctx), sb.ID)
//	res, err := c.Exec(ctx, sb.ID, emberbox.ExecRequest{Command: "uname -a", Stdout: os.Stdout, Stderr: os.Stderr})
//	if err != nil {
//		return err
//	}
//	fmt.Println("exit", *res.ExitCode)
//
// The package depends on nothing of the server's: it may be copied or vendored
// alone.
//
// A call is retried at most 4 times; a wait is the answer's Retry-After or
// `retryAfterMs` (at most 60 s), else 0.5 s doubling to 8 s with jitter, and
// the deliberate `…_unavailable` codes are never retried. Exec's timeout is 24
// hours by default (the server holds it to the lease); it tracks the byte
// offset across stdout and stderr and resumes a cut stream from
// `/processes/{pid}/output?cursor=&follow=true`. Terminal wraps the terminal
// WebSocket as Read, Write, Resize and Close plus the exit code. Nothing under
// internal/ may be imported here (a housekeeping fence).
package emberbox
