//go:build linux

package jepsen

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The test network: one bridge with the root namespace at .1 and node i at
// .10+i. Nothing else is ever addressed.
const (
	prefix     = "gpj"
	bridgeName = prefix + "-br0"
	subnet     = "10.77.0"
	hostIP     = subnet + ".1"
	// Inside each namespace every fault rule lives in these chains, so that
	// healing is a flush.
	chainIn  = "GPJ-IN"
	chainOut = "GPJ-OUT"
)

// nodeIP is the address of node i (1-based) on the test subnet.
func nodeIP(i int) string { return subnet + "." + strconv.Itoa(10+i) }

// netnsName is the namespace node name lives in.
func netnsName(name string) string { return prefix + "-" + name }

// Preflight says why the harness cannot run here, or "" when it can.
func Preflight() string {
	if os.Geteuid() != 0 {
		return "the jepsen tests create network namespaces and iptables rules: run them as root"
	}
	for _, tool := range []string{"ip", "iptables", "iptables-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("%s is not installed (Debian: apt-get install iproute2 iptables)", tool)
		}
	}
	return ""
}

// run runs a command and returns its combined output, with the command line
// in the error.
func run(name string, args ...string) (string, error) {
	return runInput(nil, name, args...)
}

func runInput(stdin []byte, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Network is the bridge and the namespaces of one run.
type Network struct {
	names []string // node names, index i-1 is node i
}

// CleanStale removes what an earlier, killed run left behind: processes in
// gpj-* namespaces, the namespaces, and gpj-* links. Only gpj-named objects
// are touched.
func CleanStale() {
	out, _ := run("ip", "netns", "list")
	for _, line := range strings.Split(out, "\n") {
		ns, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if !strings.HasPrefix(ns, prefix+"-") {
			continue
		}
		killNamespace(ns)
		run("ip", "netns", "del", ns)
	}
	out, _ = run("ip", "-o", "link", "show")
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		link, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if strings.HasPrefix(link, prefix+"-") {
			run("ip", "link", "del", link)
		}
	}
}

// killNamespace SIGKILLs every process inside ns (they are ours: only this
// harness creates gpj-* namespaces) and waits briefly for them to go.
func killNamespace(ns string) {
	for range 20 {
		out, _ := run("ip", "netns", "pids", ns)
		pids := strings.Fields(out)
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid > 1 {
				syscall.Kill(pid, syscall.SIGCONT)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// NewNetwork creates the bridge, gives the root namespace hostIP on it, and
// creates one namespace per node joined to the bridge by a veth pair, with
// the fault chains hooked in.
func NewNetwork(names []string) (*Network, error) {
	n := &Network{names: names}
	steps := [][]string{
		{"ip", "link", "add", bridgeName, "type", "bridge"},
		{"ip", "addr", "add", hostIP + "/24", "dev", bridgeName},
		{"ip", "link", "set", bridgeName, "up"},
	}
	for i, name := range names {
		ns, veth := netnsName(name), netnsName(name)+"-v"
		steps = append(steps,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "link", "set", veth, "master", bridgeName, "up"},
			[]string{"ip", "-n", ns, "addr", "add", nodeIP(i+1) + "/24", "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
		)
	}
	for _, s := range steps {
		if _, err := run(s[0], s[1:]...); err != nil {
			n.Close()
			return nil, fmt.Errorf("create test network: %w", err)
		}
	}
	for _, name := range names {
		rules := fmt.Sprintf("*filter\n:%s - [0:0]\n:%s - [0:0]\n-A INPUT -j %s\n-A OUTPUT -j %s\nCOMMIT\n", chainIn, chainOut, chainIn, chainOut)
		if err := n.restore(name, rules); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// restore loads iptables-restore input into node's namespace without
// flushing what is there.
func (n *Network) restore(node, rules string) error {
	if _, err := runInput([]byte(rules), "ip", "netns", "exec", netnsName(node), "iptables-restore", "-w", "--noflush"); err != nil {
		return fmt.Errorf("iptables in %s: %w\n%s", node, err, rules)
	}
	return nil
}

// SetFaults replaces node's fault rules: dropIn and dropOut are iptables rule
// specifications (without -A CHAIN) for incoming and outgoing packets.
func (n *Network) SetFaults(node string, in, out []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "*filter\n-F %s\n-F %s\n", chainIn, chainOut)
	for _, r := range in {
		fmt.Fprintf(&b, "-A %s %s\n", chainIn, r)
	}
	for _, r := range out {
		fmt.Fprintf(&b, "-A %s %s\n", chainOut, r)
	}
	b.WriteString("COMMIT\n")
	return n.restore(node, b.String())
}

// Heal removes every fault rule from every namespace.
func (n *Network) Heal() error {
	var errs []string
	for _, name := range n.names {
		if err := n.SetFaults(name, nil, nil); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("heal: %s", strings.Join(errs, "; "))
	}
	return nil
}

// RedirectTCP makes node's outgoing TCP connections to dst:port go to
// hostIP:via instead (the delay proxy). Connections already open keep their
// path, so it is set up before the agents start.
func (n *Network) RedirectTCP(node, dst string, port, via int) error {
	rules := fmt.Sprintf("*nat\n-A OUTPUT -p tcp -d %s --dport %d -j DNAT --to-destination %s:%d\nCOMMIT\n", dst, port, hostIP, via)
	return n.restore(node, rules)
}

// Close kills every process left in the namespaces and removes them, their
// links and the bridge (their iptables rules go with them).
func (n *Network) Close() {
	for _, name := range n.names {
		ns := netnsName(name)
		killNamespace(ns)
		run("ip", "netns", "del", ns)
		run("ip", "link", "del", ns+"-v")
	}
	run("ip", "link", "del", bridgeName)
}
