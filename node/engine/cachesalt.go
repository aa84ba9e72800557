package engine

import "github.com/gpuplane/gpuplane/internal/engines"

// AcceptsCacheSalt says whether an engine of kind keys its prefix cache by
// the request body's `cache_salt` (docs/gateway.md, Isolation), so the gateway
// sends each tenant its own salt (engines.Engine.CacheSalt): vLLM and the
// sim engine do. llama.cpp keeps tenants apart by slots instead, Ollama has
// no such field, and a command engine is unknown, so they get no salt (an
// engine that does not know the field may refuse the request).
func AcceptsCacheSalt(kind string) bool {
	r, err := engines.Lookup(kind)
	return err == nil && r.CacheSalt
}
