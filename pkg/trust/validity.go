package trust

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"
)

// Backdate is how far before its issue a certificate from Authority
// becomes valid, so that peers whose clocks run a little behind the CA's
// accept it at once (step-ca backdates 1 minute, Vault 30 s).
const Backdate = time.Minute

// Reasons of a CertificateTimeError, as metric label values.
const (
	ReasonNotYetValid = "certificate_not_yet_valid"
	ReasonExpired     = "certificate_expired"
)

// CertificateTimeError is a certificate outside its validity period by
// the clock that judged it. Between parts of the mesh whose clocks agree
// it means an expired certificate; otherwise a clock is skewed by at
// least Skew, and the message says so.
type CertificateTimeError struct {
	Certificate *x509.Certificate
	// Now is the judging clock's reading.
	Now time.Time
}

// NotYetValid reports whether the certificate's validity starts after Now
// (otherwise it ended before).
func (e *CertificateTimeError) NotYetValid() bool { return e.Now.Before(e.Certificate.NotBefore) }

// Reason is ReasonNotYetValid or ReasonExpired.
func (e *CertificateTimeError) Reason() string {
	if e.NotYetValid() {
		return ReasonNotYetValid
	}
	return ReasonExpired
}

// Skew is how far Now lies outside the validity period: the least the
// judging clock and the issuer's disagree by, if the certificate is
// current by the issuer's.
func (e *CertificateTimeError) Skew() time.Duration {
	if e.NotYetValid() {
		return e.Certificate.NotBefore.Sub(e.Now)
	}
	return e.Now.Sub(e.Certificate.NotAfter)
}

func (e *CertificateTimeError) Error() string {
	c := e.Certificate
	name := describeSANs(c.URIs)
	if len(c.URIs) == 0 && c.Subject.CommonName != "" {
		name = fmt.Sprintf("%q", c.Subject.CommonName)
	}
	now := e.Now.UTC().Format(time.RFC3339)
	skew := e.Skew().Round(time.Millisecond)
	if e.NotYetValid() {
		return fmt.Sprintf("certificate not yet valid: %s is valid from %s, %v after this clock's %s (is this clock behind?)",
			name, c.NotBefore.UTC().Format(time.RFC3339), skew, now)
	}
	return fmt.Sprintf("certificate expired: %s expired at %s, %v before this clock's %s (expired, or this clock is ahead)",
		name, c.NotAfter.UTC().Format(time.RFC3339), skew, now)
}

// CheckValidity returns a *CertificateTimeError if c is not valid at now.
func CheckValidity(c *x509.Certificate, now time.Time) error {
	if now.Before(c.NotBefore) || now.After(c.NotAfter) {
		return &CertificateTimeError{Certificate: c, Now: now}
	}
	return nil
}

// ExplainValidity turns err, if it is the x509 package's "expired or not
// yet valid" (which says neither which nor by how much), into a
// *CertificateTimeError judged at now; other errors pass unchanged. For
// handshake errors of crypto/tls's own verification (ServerConfig's client
// certificates), with now from the config's Time.
func ExplainValidity(err error, now time.Time) error {
	var ie x509.CertificateInvalidError
	if errors.As(err, &ie) && ie.Reason == x509.Expired && ie.Cert != nil {
		return &CertificateTimeError{Certificate: ie.Cert, Now: now}
	}
	return err
}
