// Package bearer reads an HTTP Authorization header's bearer token. The
// control plane's RPC and the node's gateway accept tokens the same way, so
// the rule lives once; it imports nothing of the project.
package bearer

import "strings"

// Token returns the secret of an "Authorization: Bearer <secret>" header
// value (scheme in any case, surrounding space ignored), and false when h
// is not a bearer credential or its secret is empty.
func Token(h string) (string, bool) {
	scheme, secret, ok := strings.Cut(strings.TrimSpace(h), " ")
	secret = strings.TrimSpace(secret)
	if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" {
		return "", false
	}
	return secret, true
}
