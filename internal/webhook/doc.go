// Package webhook tells the systems of a key's owner what happened to its
// sandboxes, snapshots and images: the account's event feed, and webhooks
// that receive each event as a signed POST.
//
// The feed is written by the store in the transaction that makes the change
// an event reports (a sandbox stopping, a snapshot becoming ready), so a
// change is never committed without its event. The Dispatcher turns the
// feed into deliveries, one row per webhook and event in the store (the
// outbox), and sends them: at least once, in order per resource, retried
// with backoff for a day, across restarts and kill -9 of the server. A
// receiver checks each delivery with withruntime.verify_webhook: the
// Runtime-Signature header is t=<unix seconds>,v1=<hex HMAC-SHA256 of
// "<t>.<body>">, one v1 per live secret.
package webhook
