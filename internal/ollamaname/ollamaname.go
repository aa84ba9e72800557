// Package ollamaname reads model names as Ollama does (its types/model
// Name): [host/][namespace/]model[:tag][@digest], with host
// registry.ollama.ai, namespace library and tag latest by default, compared
// without regard to case. The node's Ollama driver and the sim engine's
// Ollama dialect share it, so that both match names as Ollama does.
package ollamaname

import "strings"

// Name is a parsed model name, its defaults filled in.
type Name struct{ Host, Namespace, Model, Tag string }

// Defaults Ollama fills in.
const (
	DefaultHost      = "registry.ollama.ai"
	DefaultNamespace = "library"
	DefaultTag       = "latest"
)

// Parse reads s; a digest ("@sha256:…") names the same model and is
// dropped.
func Parse(s string) Name {
	n := Name{Host: DefaultHost, Namespace: DefaultNamespace, Tag: DefaultTag}
	s, _, _ = strings.Cut(s, "@")
	if i := strings.LastIndex(s, ":"); i > strings.LastIndex(s, "/") {
		n.Tag, s = s[i+1:], s[:i]
	}
	parts := strings.Split(s, "/")
	n.Model = parts[len(parts)-1]
	if len(parts) >= 2 {
		n.Namespace = parts[len(parts)-2]
	}
	if len(parts) >= 3 {
		n.Host = strings.Join(parts[:len(parts)-2], "/")
	}
	return n
}

// Same says a and b name the same model in Ollama's store.
func Same(a, b string) bool {
	x, y := Parse(a), Parse(b)
	return strings.EqualFold(x.Host, y.Host) && strings.EqualFold(x.Namespace, y.Namespace) &&
		strings.EqualFold(x.Model, y.Model) && strings.EqualFold(x.Tag, y.Tag)
}

// Shortest is the name as /api/ps and /api/tags list it (Ollama's
// DisplayShortest): the default host, and then the default namespace,
// left out; the tag always there.
func Shortest(s string) string {
	n := Parse(s)
	out := n.Model + ":" + n.Tag
	if strings.EqualFold(n.Host, DefaultHost) {
		if !strings.EqualFold(n.Namespace, DefaultNamespace) {
			out = n.Namespace + "/" + out
		}
		return out
	}
	return n.Host + "/" + n.Namespace + "/" + out
}
