package rpc

import (
	_ "embed"
	"net/http"
)

// uiPage is the read-only web UI: one page that lists nodes, devices,
// accelerators, deployments and replicas through the same Connect JSON API
// the CLI uses, so it shows exactly what the API allows the viewer to see.
//
//go:embed ui/index.html
var uiPage []byte

func serveUI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
	_, _ = w.Write(uiPage)
}
