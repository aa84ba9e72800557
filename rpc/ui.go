package rpc

import (
	"embed"
	"net/http"
)

// The web dashboard: one page and its script and style sheet, embedded so
// that the binary serves it with no build step and the browser fetches
// nothing from anywhere else. It reads the Connect JSON API
// (DashboardService.Summary, dashboard.go, and the residency decisions),
// so it shows exactly what the API allows the viewer to see.
//
//go:embed ui/index.html ui/app.js ui/style.css
var uiFiles embed.FS

// uiCSP allows the page its own script, style sheet and API only. Bar
// widths are set through the CSSOM, which style-src does not govern.
const uiCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'"

var uiTypes = map[string]string{
	"index.html": "text/html; charset=utf-8",
	"app.js":     "text/javascript; charset=utf-8",
	"style.css":  "text/css; charset=utf-8",
}

func serveUI(w http.ResponseWriter, _ *http.Request) {
	serveUIFile(w, "index.html")
}

// serveUIAsset serves /ui/{file}: the page's script and style sheet.
func serveUIAsset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	if _, ok := uiTypes[name]; !ok {
		http.NotFound(w, r)
		return
	}
	serveUIFile(w, name)
}

func serveUIFile(w http.ResponseWriter, name string) {
	b, err := uiFiles.ReadFile("ui/" + name)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", uiTypes[name])
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", uiCSP)
	_, _ = w.Write(b)
}
