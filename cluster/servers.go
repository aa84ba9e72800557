package cluster

// ServerAPI returns the API address of a server that can serve this node's
// log-backed streams (events, audit): the node itself on a server, else a
// live server known through gossip, preferring the leader.
func (c *Cluster) ServerAPI() (string, bool) {
	if c.IsServer() {
		return c.APIAddress(c.cfg.NodeName)
	}
	name := c.pickServer()
	if name == "" {
		return "", false
	}
	if g := c.mem.gossip.Load(); g != nil {
		if m, ok := g.Member(name); ok && m.Meta.API != "" {
			return m.Meta.API, true
		}
	}
	return "", false
}
