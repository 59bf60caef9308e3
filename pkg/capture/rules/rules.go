// Package rules writes the redirection rules inside a pod's network
// namespace that send its TCP traffic through the node proxy's in-pod
// listeners (docs/design.md §2, §10):
//
//   - outbound TCP leaving the pod (not over loopback) is redirected to the
//     outbound port (15001), where the original destination is read back
//     with SO_ORIGINAL_DST;
//   - inbound TCP arriving from outside the pod, except to the HBONE port
//     (15008), is redirected to the inbound plaintext port (15006);
//   - the node proxy's own sockets carry a mark (0x539) and are never
//     redirected, or the proxy would capture itself;
//   - connections from the probe sources (the node's side of the pod's
//     link, where kubelet's health probes come from) are not redirected, so
//     probes reach the application as they did before capture.
//
// One back end writes them (nftables over netlink, in a table of its own,
// so no binary is needed in the node agent's image); Backend is the seam
// for another (iptables).
package rules

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/causeway-mesh/causeway/pkg/capture"
)

// Config is what the rules of one pod depend on.
type Config struct {
	// OutboundPort takes the pod's outbound TCP (default 15001).
	OutboundPort uint16
	// InboundPort takes inbound plaintext TCP (default 15006).
	InboundPort uint16
	// HBONEPort is left alone on the way in (default 15008).
	HBONEPort uint16
	// Mark and MarkMask identify the node proxy's own sockets (default
	// 0x539/0xfff, ztunnel's values).
	Mark, MarkMask uint32
	// ProbeSources are the addresses health probes come from; traffic
	// from them is not redirected. Anything else sending from these
	// addresses (host-network pods on the node) also skips the proxy: the
	// same trade Istio makes with its probe address.
	ProbeSources []netip.Addr
}

// Defaults fills zero fields with the default ports and mark.
func (c Config) Defaults() Config {
	if c.OutboundPort == 0 {
		c.OutboundPort = capture.OutboundPort
	}
	if c.InboundPort == 0 {
		c.InboundPort = capture.InboundPort
	}
	if c.HBONEPort == 0 {
		c.HBONEPort = capture.HBONEPort
	}
	if c.Mark == 0 {
		c.Mark, c.MarkMask = capture.ProxyMark, capture.ProxyMarkMask
	}
	if c.MarkMask == 0 {
		c.MarkMask = 0xffffffff
	}
	return c
}

// Validate reports a configuration that cannot be written.
func (c Config) Validate() error {
	if c.OutboundPort == c.InboundPort || c.OutboundPort == c.HBONEPort || c.InboundPort == c.HBONEPort {
		return fmt.Errorf("rules: ports %d, %d, %d must differ", c.OutboundPort, c.InboundPort, c.HBONEPort)
	}
	if c.Mark&c.MarkMask != c.Mark {
		return fmt.Errorf("rules: mark %#x has bits outside its mask %#x", c.Mark, c.MarkMask)
	}
	for _, a := range c.ProbeSources {
		if !a.IsValid() || a.Zone() != "" {
			return fmt.Errorf("rules: probe source %q is not a plain IP address", a)
		}
	}
	return nil
}

// Backend writes, removes and verifies the rules in one network namespace,
// named by an open descriptor of it (/proc/<pid>/ns/net, /var/run/netns/x).
// Apply is idempotent: applying twice leaves the same rules as once.
// Delete removes them and succeeds when there are none.
type Backend interface {
	Apply(netns int, c Config) error
	Delete(netns int) error
	// Check returns ErrMissing (wrapped, with what differs) when the
	// namespace does not hold exactly the rules Apply(c) writes.
	Check(netns int, c Config) error
}

// ErrMissing says the rules in a namespace are absent or not as written.
var ErrMissing = errors.New("capture rules missing or changed")
