package api

// The route handlers live on small types, one per area of the API, so that
// server keeps only the plumbing every route shares (serveRoute, auth,
// limits, idempotency, errors) and the helpers of more than one area. Each
// area holds the server for that plumbing; routeTable names its handlers.

// sandboxesAPI serves the sandboxes themselves: create, read, list, change,
// the power verbs and their events.
type sandboxesAPI struct{ *server }

// snapshots serves snapshots and forks.
type snapshots struct{ *server }

// checkpointsAPI serves the checkpoints of sandboxes.
type checkpointsAPI struct{ *server }

// imagesAPI serves the image catalog and its build contexts.
type imagesAPI struct{ *server }

// volumesAPI serves volumes, their attachments and backups.
type volumesAPI struct{ *server }

// usageAPI serves usage, charges, limits and a sandbox's metrics.
type usageAPI struct{ *server }

// nodesAPI serves the nodes of a cluster.
type nodesAPI struct{ *server }

// files serves a sandbox's files and archives.
type files struct{ *server }

// uploadsAPI serves chunked uploads of files and archives.
type uploadsAPI struct{ *server }

// processes serves exec and the background processes of a sandbox.
type processes struct{ *server }

// sockets serves the WebSocket routes: terminals and port tunnels.
type sockets struct{ *server }

// previewsAPI serves the previews of a sandbox's ports (not their hosts).
type previewsAPI struct{ *server }

// interpreterAPI serves the code interpreter.
type interpreterAPI struct{ *server }

// browserAPI serves a sandbox's browser (browser.go).
type browserAPI struct{ *server }

// desktopAPI serves a sandbox's desktop (desktop.go).
type desktopAPI struct{ *server }

// mcpAPI serves the MCP catalog and a sandbox's MCP servers (mcp.go).
type mcpAPI struct{ *server }

// watches serves watches of a sandbox's directories.
type watches struct{ *server }

// linksAPI serves signed file links.
type linksAPI struct{ *server }

// networkAPI serves a sandbox's egress policy.
type networkAPI struct{ *server }

// webhooksAPI (webhooks.go) serves webhooks, deliveries and the feed.

// areas are the handlers of every area, for routeTable.
type areas struct {
	sandboxes   sandboxesAPI
	snapshots   snapshots
	checkpoints checkpointsAPI
	images      imagesAPI
	volumes     volumesAPI
	usage       usageAPI
	nodes       nodesAPI
	files       files
	uploads     uploadsAPI
	processes   processes
	sockets     sockets
	previews    previewsAPI
	interpreter interpreterAPI
	browser     browserAPI
	desktop     desktopAPI
	mcp         mcpAPI
	watches     watches
	links       linksAPI
	network     networkAPI
	webhooks    webhooksAPI
	secrets     secretsAPI
}

func (s *server) areas() areas {
	return areas{
		sandboxes: sandboxesAPI{s}, snapshots: snapshots{s}, checkpoints: checkpointsAPI{s}, images: imagesAPI{s}, volumes: volumesAPI{s},
		usage: usageAPI{s}, nodes: nodesAPI{s}, files: files{s}, uploads: uploadsAPI{s}, processes: processes{s},
		sockets: sockets{s}, previews: previewsAPI{s}, interpreter: interpreterAPI{s}, browser: browserAPI{s}, desktop: desktopAPI{s}, mcp: mcpAPI{s}, watches: watches{s},
		links: linksAPI{s}, network: networkAPI{s}, webhooks: webhooksAPI{s}, secrets: secretsAPI{s},
	}
}
