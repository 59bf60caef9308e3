package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/causeway-mesh/causeway/bench/internal/faultload"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// The clock skew row: the client's node proxy (node-a) judges certificates
// by its clock plus the offset in clockFile (--clock-offset-file), set an
// hour ahead, right, an hour behind, right again.
const skew = time.Hour

// skewPhase is how long each skew lasts.
const skewPhase = 3 * time.Second

// setClock writes node-a's clock offset; the node proxy reads it within
// 100 ms.
func (h *harness) setClock(d time.Duration) error {
	return writeAtomic(h.clockFile, d.String())
}

// clockSkew injects both skews and checks what node-a says about them:
// refusal reasons in its metrics and log, with the skew, and recovery once
// its clock is right.
func clockSkew(ctx context.Context, h *harness) (outcome, error) {
	logPath := h.mesh.LogPath(nodeProxyA)
	logFrom, err := fileSize(logPath)
	if err != nil {
		return outcome{}, err
	}
	before, err := h.closedByReason(nodeProxyA)
	if err != nil {
		return outcome{}, err
	}
	peer, err := newPeerProbe(h)
	if err != nil {
		return outcome{}, err
	}
	var notes, problems []string

	// Ahead: every certificate node-a holds or is sent looks expired, its
	// own first (new connections need it).
	if err := h.setClock(skew); err != nil {
		return outcome{}, err
	}
	skewed := time.Now()
	refused, ok := h.until(ctx, 5*time.Second, func() bool { return h.load.One(h.load.Fresh).Cause != "" })
	if !ok {
		problems = append(problems, "new connections still served 5 s after the clock went ahead")
	}
	faultload.Sleep(ctx, time.Until(skewed.Add(skewPhase)))
	if err := h.setClock(0); err != nil {
		return outcome{}, err
	}
	aheadBack, ok := h.until(ctx, 30*time.Second, func() bool { return h.load.One(h.load.Fresh).Cause == "" })
	if !ok {
		problems = append(problems, "new connections not served 30 s after the clock ahead was set right")
	}
	notes = append(notes, fmt.Sprintf("clock %v ahead: new connections refused %v after, served again %v after it was set right",
		skew, refused.Round(time.Millisecond), aheadBack.Round(time.Millisecond)))

	// Behind: node-a's own certificate is still handed out (peers judge
	// it), but the certificates peers present are not yet valid by it. A
	// new handshake shows that: the harness's, as a waypoint would make.
	if err := peer.handshake(); err != nil {
		return outcome{}, fmt.Errorf("peer handshake with the clock right: %w", err)
	}
	if err := h.setClock(-skew); err != nil {
		return outcome{}, err
	}
	skewed = time.Now()
	refused, ok = h.until(ctx, 5*time.Second, func() bool { return peer.handshake() != nil })
	if !ok {
		problems = append(problems, "a peer's new handshake still accepted 5 s after the clock went behind")
	}
	faultload.Sleep(ctx, time.Until(skewed.Add(skewPhase)))
	if err := h.setClock(0); err != nil {
		return outcome{}, err
	}
	behindBack, ok := h.until(ctx, 30*time.Second, func() bool { return peer.handshake() == nil })
	if !ok {
		problems = append(problems, "a peer's handshake still refused 30 s after the clock behind was set right")
	}
	notes = append(notes, fmt.Sprintf("clock %v behind: a peer's new handshake refused %v after, accepted again %v after it was set right",
		skew, refused.Round(time.Millisecond), behindBack.Round(time.Millisecond)))

	after, err := h.closedByReason(nodeProxyA)
	if err != nil {
		return outcome{}, err
	}
	expired := after[trust.ReasonExpired] - before[trust.ReasonExpired]
	if expired == 0 {
		problems = append(problems, "no connection closed with reason "+trust.ReasonExpired)
	}
	notes = append(notes, fmt.Sprintf("tcp_connections_closed_total{reason=%q} +%v", trust.ReasonExpired, expired))
	// The log says which and by how much.
	for _, want := range []struct {
		what    string
		markers []string
		example string
	}{
		{"refused connection (access log)", []string{`"logger":"access"`, "certificate expired: "}, `"result":`},
		{"refused handshake", []string{`"reason":"` + trust.ReasonNotYetValid + `"`}, `"error":`},
	} {
		line, err := firstLineWith(logPath, logFrom, want.markers)
		if err != nil {
			return outcome{}, err
		}
		if line == "" {
			problems = append(problems, fmt.Sprintf("no %s in %s's log with %q", want.what, nodeProxyA, want.markers))
			continue
		}
		notes = append(notes, fmt.Sprintf("%s: %s", want.what, excerpt(line, want.example)))
	}
	return outcome{note: strings.Join(notes, "; "), problem: strings.Join(problems, "; ")}, nil
}

// until polls cond every 50 ms until it holds (true) or limit passes,
// and says how long that took.
func (h *harness) until(ctx context.Context, limit time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > limit || ctx.Err() != nil {
			return time.Since(start), false
		}
		faultload.Sleep(ctx, 50*time.Millisecond)
	}
}

// peerProbe handshakes with node-a's HBONE listener at the client pod's
// address as a mesh peer (a certificate from the mesh's CA, valid by the
// host's clock), so that node-a judges a certificate it has not seen.
type peerProbe struct {
	addr string
	ca   *trust.Authority
	cfg  *tls.Config
	id   trust.Identity
}

func newPeerProbe(h *harness) (*peerProbe, error) {
	ca, err := trust.LoadCA(filepath.Join(h.mesh.Opts.StateDir, "ca"), 10*time.Minute)
	if err != nil {
		return nil, err
	}
	bundle, err := trust.NewBundle(trust.DefaultTrustDomain, ca.Roots())
	if err != nil {
		return nil, err
	}
	id, err := trust.ParseIdentity("spiffe://cluster.local/ns/shop/sa/waypoint")
	if err != nil {
		return nil, err
	}
	server, err := trust.ParseIdentity("spiffe://cluster.local/ns/web/sa/frontend")
	if err != nil {
		return nil, err
	}
	pod, err := h.mesh.Plan.Pod("web/frontend")
	if err != nil {
		return nil, err
	}
	p := &peerProbe{addr: net.JoinHostPort(pod.IP, "15008"), ca: ca, id: id}
	p.cfg = trust.ClientConfig(bundle, p.certificate, []trust.Identity{server})
	return p, nil
}

// certificate is a new one each time, valid from a minute ago.
func (p *peerProbe) certificate() (*tls.Certificate, error) {
	key, csrPEM, err := trust.NewKeyAndCSR(p.id)
	if err != nil {
		return nil, err
	}
	csr, err := trust.ParseCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	chain, err := p.ca.Sign(csr, p.id, 10*time.Minute)
	if err != nil {
		return nil, err
	}
	return trust.TLSCertificate(chain, key)
}

// handshake returns nil when node-a accepts the probe's certificate: in
// TLS 1.3 the server's verdict on it arrives after the client's side of
// the handshake is done, as an alert or as the HTTP/2 server preface.
func (p *peerProbe) handshake() error {
	c, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, p.cfg)
	if err := tc.Handshake(); err != nil {
		return err
	}
	_, err = tc.Read(make([]byte, 1))
	return err
}

// closedByReason sums a node proxy's tcp_connections_closed_total by
// reason.
func (h *harness) closedByReason(name string) (map[string]float64, error) {
	out := map[string]float64{}
	err := h.scrape(name, func(line string) error {
		labels, ok := strings.CutPrefix(line, "tcp_connections_closed_total{")
		if !ok {
			return nil
		}
		_, rest, ok := strings.Cut(labels, `reason="`)
		if !ok {
			return nil
		}
		reason, rest, _ := strings.Cut(rest, `"`)
		_, value, _ := strings.Cut(rest, "} ")
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return fmt.Errorf("%q: %w", line, err)
		}
		out[reason] += v
		return nil
	})
	return out, err
}

func fileSize(path string) (int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// firstLineWith returns the first line from offset on that holds every
// marker ("" if none).
func firstLineWith(path string, offset int64, markers []string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return "", err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
next:
	for sc.Scan() {
		for _, m := range markers {
			if !strings.Contains(sc.Text(), m) {
				continue next
			}
		}
		return sc.Text(), nil
	}
	return "", sc.Err()
}

// excerpt is a log line from the field named by from on, cut short.
func excerpt(line, from string) string {
	if i := strings.Index(line, from); i >= 0 {
		line = line[i:]
	}
	if len(line) > 300 {
		line = line[:300] + "…"
	}
	return line
}
