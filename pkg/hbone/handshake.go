package hbone

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// Reasons an inbound connection was refused before it could carry a
// tunnel: the label values of hbone_handshake_failures_total.
const (
	// The client's certificate, by the server's verification.
	FailNoClientCertificate = "no_client_certificate" // required, none presented
	FailExpired             = trust.ReasonExpired     // by this clock (expired, or the clock ahead)
	FailNotYetValid         = trust.ReasonNotYetValid // by this clock (the clock behind)
	FailUnknownAuthority    = "unknown_authority"     // does not chain to the bundle's roots
	FailBadCertificate      = "bad_certificate"       // chains, but not a usable mesh identity (SAN, trust domain, usage)
	// The client refused the server (sent an alert: our certificate, by
	// its verification or clock).
	FailPeerRefused = "peer_refused"
	// Not an HBONE client: not TLS, not TLS 1.3, or no ALPN h2.
	FailProtocol = "protocol"
	// No certificate to present for the address dialed.
	FailNoServerCertificate = "no_server_certificate"
	FailTimeout             = "timeout"     // the handshake outlasted HandshakeTimeout
	FailPeerClosed          = "peer_closed" // the client hung up (EOF, reset)
	FailOther               = "other"
)

// handshakeFailures are every reason, so that each series exists at zero.
var handshakeFailures = []string{FailNoClientCertificate, FailExpired, FailNotYetValid, FailUnknownAuthority,
	FailBadCertificate, FailPeerRefused, FailProtocol, FailNoServerCertificate, FailTimeout, FailPeerClosed, FailOther}

// handshakeFailure names why a server-side TLS handshake failed. err is
// the handshake's error after trust.ExplainValidity. Some of crypto/tls's
// errors are not typed; those are told by their text
// (TestHandshakeFailureReasons pins them with real handshakes).
func handshakeFailure(err error) string {
	var te *trust.CertificateTimeError
	var ua x509.UnknownAuthorityError
	var cv *tls.CertificateVerificationError
	var rh tls.RecordHeaderError
	var op *net.OpError
	var ie *trust.ClientIdentityError
	switch {
	case errors.As(err, &te):
		return te.Reason()
	case errors.As(err, &ua):
		return FailUnknownAuthority
	case errors.As(err, &cv), errors.As(err, &ie):
		return FailBadCertificate
	case errors.As(err, &op) && op.Op == "remote error":
		return FailPeerRefused
	case errors.Is(err, os.ErrDeadlineExceeded):
		return FailTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return FailPeerClosed
	case errors.As(err, &rh):
		return FailProtocol
	case errors.Is(err, trust.ErrNoServerCertificate):
		return FailNoServerCertificate
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "didn't provide a certificate"):
		return FailNoClientCertificate
	case strings.Contains(msg, "unsupported versions"), strings.Contains(msg, "unsupported application protocols"):
		return FailProtocol
	}
	return FailOther
}

// newHandshakeFailures registers the counter with reg (nil: counted,
// not exposed).
func newHandshakeFailures(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hbone_handshake_failures_total",
		Help: "Inbound HBONE connections refused during or right after the TLS handshake, by reason: " + strings.Join(handshakeFailures, ", ") + ".",
	}, []string{"reason"})
	for _, r := range handshakeFailures {
		c.WithLabelValues(r)
	}
	if reg != nil {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}
