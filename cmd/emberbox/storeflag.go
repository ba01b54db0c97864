package main

import (
	"os"
	"path/filepath"
)

// storeEnv names the store when --store is not given. A URL with a
// password is better passed here than on the command line, where every
// user of the host can read it.
const storeEnv = "EMBERBOX_STORE"

const storeUsage = "the store: a postgres:// URL, shared by the nodes of a cluster (default $" + storeEnv +
	", else the SQLite file in --data-dir)"

// storeDSN is what store.Open is given: flag, else $EMBERBOX_STORE, else
// the SQLite file in dataDir.
func storeDSN(flag, dataDir string) string {
	if flag == "" {
		flag = os.Getenv(storeEnv)
	}
	if flag != "" {
		return flag
	}
	return filepath.Join(dataDir, dbName)
}
