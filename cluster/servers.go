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

// ServerAddresses returns the API address of every Raft server this node
// knows, by server id; a server that has not registered its node yet is
// missing.
func (c *Cluster) ServerAddresses() (map[string]string, error) {
	if !c.IsServer() {
		return nil, ErrNoLog
	}
	fut := c.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return nil, c.raftError(err)
	}
	out := map[string]string{}
	for _, s := range fut.Configuration().Servers {
		if addr, ok := c.APIAddress(string(s.ID)); ok {
			out[string(s.ID)] = addr
		} else {
			out[string(s.ID)] = ""
		}
	}
	return out, nil
}
