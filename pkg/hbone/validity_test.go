package hbone

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// TestServerExplainsCertificateTime: a server whose clock is an hour
// ahead refuses the client's current certificate (10 minutes of life) and
// warns that it is expired by its clock, with the skew.
func TestServerExplainsCertificateTime(t *testing.T) {
	m := newMesh(t)
	m.clientCert = m.ca.Certificate(t, m.clientID, 10*time.Minute)
	bundle, err := trust.NewBundle(td, m.ca.Bundle.Roots())
	if err != nil {
		t.Fatal(err)
	}
	bundle.SetClock(func() time.Time { return time.Now().Add(time.Hour) })
	core, logs := observer.New(zapcore.DebugLevel)
	_, addr := startServer(t, m, &dialHandler{}, func(o *ServerOptions) {
		o.TLS = trust.ServerConfig(bundle, func(net.Addr) (*tls.Certificate, error) { return m.serverCert, nil }, trust.RequireClientCert)
		o.Logger = zap.New(core)
	})
	if _, err := newPool(t, m, nil).Dial(ctxTimeout(t, 10*time.Second), m.target(addr, "127.0.0.1:9")); err == nil {
		t.Fatal("tunnel opened with a certificate expired by the server's clock")
	}
	eventually(t, 5*time.Second, "the refusal's warning", func() bool {
		for _, e := range logs.FilterMessage("TLS handshake refused: client certificate outside its validity period").All() {
			f := e.ContextMap()
			skew, _ := f["skew"].(time.Duration)
			if e.Level == zapcore.WarnLevel && f["reason"] == trust.ReasonExpired && skew > 49*time.Minute && skew < 51*time.Minute {
				return true
			}
		}
		return false
	})
}
