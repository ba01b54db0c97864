// Package apistore gives the HTTP API the store's API keys, idempotency
// records and sandbox event logs, as the interfaces internal/api declares
// (api.Keys, api.KeyLister, api.Idempotency, api.Events), which also serve
// internal/e2b's front.
//
// It stands between the two because neither may hold it: internal/api
// reaches no state but through its interfaces (a dependency fence of
// internal/housekeeping), and internal/store cannot import internal/api,
// whose own tests open a store.
package apistore
