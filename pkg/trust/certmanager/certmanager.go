// Package certmanager keeps one certificate per identity for a node proxy
// (docs/design.md §3): it fetches them from the CA with keys generated here (the
// keys never leave the process), prefetches at low priority, serves
// traffic's urgent requests first, refreshes at half the lifetime with
// jitter, backs off per identity on errors, keeps serving a still-valid
// certificate while refreshing fails, and bounds concurrent fetches.
package certmanager

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// CertificateFetcher obtains a certificate chain (PEM, leaf first, roots
// last) for id from a CSR. caclient.Client is the CA over gRPC;
// AuthorityFetcher signs in process.
type CertificateFetcher interface {
	Fetch(ctx context.Context, id trust.Identity, csrPEM []byte, ttl time.Duration) ([]string, error)
}

// AuthorityFetcher fetches from an authority in the same process: the
// control plane uses it for its own serving certificate.
type AuthorityFetcher struct{ Authority *trust.Authority }

// Fetch implements CertificateFetcher.
func (a AuthorityFetcher) Fetch(_ context.Context, id trust.Identity, csrPEM []byte, ttl time.Duration) ([]string, error) {
	csr, err := trust.ParseCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	return a.Authority.Sign(csr, id, ttl)
}

// States of a certificate as shown in Snapshot; a failed fetch shows as
// "Unavailable: <error>".
const (
	StateInitializing = "Initializing"
	StateAvailable    = "Available"
	StateUnavailable  = "Unavailable"
)

// Defaults of Options.
const (
	DefaultMaxConcurrentFetches = 8
	DefaultInitialBackoff       = 500 * time.Millisecond
	DefaultMaxBackoff           = 150 * time.Second
	DefaultFetchTimeout         = 30 * time.Second
)

// minRefreshDelay is the shortest time between a fetch and the next refresh.
const minRefreshDelay = 100 * time.Millisecond

// maxExpiryMargin bounds ExpiryMargin: the longest a handshake may take
// (hbone's default handshake timeout).
const maxExpiryMargin = 10 * time.Second

// ExpiryMargin is how long before its expiry a certificate of the given
// lifetime stops being handed out: a tenth of its life, at most 10 s, so
// that a certificate handed out does not expire while the peer is still to
// check it.
func ExpiryMargin(lifetime time.Duration) time.Duration { return min(lifetime/10, maxExpiryMargin) }

// retrySpread is how far the retries of identities backing off are
// spread once a fetch succeeds again (the CA is back).
const retrySpread = time.Second

// ErrStopped is returned by Get once Run has returned.
var ErrStopped = errors.New("certificate manager stopped")

// Options configure a Manager.
type Options struct {
	// Fetcher asks the CA. Required.
	Fetcher CertificateFetcher
	// TTL is the lifetime requested (0: the CA's default).
	TTL time.Duration
	// MaxConcurrentFetches bounds fetches in flight (default 8).
	MaxConcurrentFetches int
	// InitialBackoff and MaxBackoff bound the per-identity wait after a
	// failed fetch, doubling from one to the other (default 0.5 s, 150 s).
	InitialBackoff, MaxBackoff time.Duration
	// FetchTimeout bounds one fetch (default 30 s).
	FetchTimeout time.Duration
	// Bundle, if set, takes its roots from the CA's answers (the trailing
	// self-signed elements of each chain), so that a root rotation done at
	// the CA reaches this process. The CA must then send every root in use.
	Bundle *trust.Bundle
	// Logger (default: none).
	Logger *zap.Logger
	// Clock judges certificates' validity periods (default time.Now; fault
	// tests skew it). Refresh timing follows the system's monotonic clock.
	Clock func() time.Time
}

// Manager holds the certificates. Run must be running for fetches to happen.
type Manager struct {
	opts Options
	log  *zap.Logger
	wake chan struct{}

	mu       sync.Mutex
	entries  map[trust.Identity]*entry
	inFlight int
	seq      uint64
	running  bool
	stopped  bool
}

// entry is the state of one identity. Guarded by Manager.mu.
type entry struct {
	id    trust.Identity
	seq   uint64 // creation order: FIFO among equals
	cert  *tls.Certificate
	chain []*x509.Certificate // as the CA returned it, roots included
	// margin: cert is handed out only until that long before its expiry.
	margin time.Duration
	// lastErr is the error of the last fetch, nil after a success.
	lastErr error
	// due is when the next fetch should start; zero means now.
	due      time.Time
	backoff  time.Duration
	waiters  int // Get calls waiting: high priority
	fetching bool
	attempts uint64 // completed fetches, successful or not
	// changed is closed (and replaced) whenever the entry changes.
	changed chan struct{}
	gone    bool // forgotten
}

// New returns a manager; start it with Run.
func New(o Options) (*Manager, error) {
	if o.Fetcher == nil {
		return nil, errors.New("certificate manager: no fetcher")
	}
	if o.TTL < 0 {
		return nil, fmt.Errorf("certificate manager: negative TTL %s", o.TTL)
	}
	if o.MaxConcurrentFetches <= 0 {
		o.MaxConcurrentFetches = DefaultMaxConcurrentFetches
	}
	if o.InitialBackoff <= 0 {
		o.InitialBackoff = DefaultInitialBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	o.MaxBackoff = max(o.MaxBackoff, o.InitialBackoff)
	if o.FetchTimeout <= 0 {
		o.FetchTimeout = DefaultFetchTimeout
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return &Manager{
		opts:    o,
		log:     o.Logger.Named("certificates"),
		wake:    make(chan struct{}, 1),
		entries: map[trust.Identity]*entry{},
	}, nil
}

// Run schedules fetches until ctx ends, then waits for the fetches in
// flight to stop and returns. Get fails with ErrStopped afterwards.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.running || m.stopped {
		m.mu.Unlock()
		return errors.New("certificate manager: Run called twice")
	}
	m.running = true
	m.mu.Unlock()
	var workers sync.WaitGroup
	defer func() {
		workers.Wait()
		m.mu.Lock()
		m.stopped = true
		for _, e := range m.entries {
			e.notify()
		}
		m.mu.Unlock()
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		m.mu.Lock()
		next := m.dispatchLocked(ctx, &workers)
		m.mu.Unlock()

		timer.Reset(max(time.Until(next), 0))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.wake:
		case <-timer.C:
		}
	}
}

// dispatchLocked starts fetches while slots are free, most urgent first,
// and returns when the next waiting entry becomes due. A linear scan: a node
// holds at most a few hundred identities and this runs on events only.
func (m *Manager) dispatchLocked(ctx context.Context, workers *sync.WaitGroup) time.Time {
	now := time.Now()
	for m.inFlight < m.opts.MaxConcurrentFetches {
		var best *entry
		for _, e := range m.entries {
			if e.fetching || e.due.After(now) {
				continue
			}
			if best == nil || e.before(best) {
				best = e
			}
		}
		if best == nil {
			break
		}
		best.fetching = true
		m.inFlight++
		workers.Go(func() { m.fetch(ctx, best) })
	}
	// Entries already due but not started wait for a free slot: the end of
	// a fetch wakes the loop. Only future due times need the timer.
	next := now.Add(time.Hour)
	for _, e := range m.entries {
		if !e.fetching && e.due.After(now) && e.due.Before(next) {
			next = e.due
		}
	}
	return next
}

// before orders due entries: waited-for (high priority) first, then the
// longest overdue, then the oldest.
func (e *entry) before(o *entry) bool {
	if (e.waiters > 0) != (o.waiters > 0) {
		return e.waiters > 0
	}
	if !e.due.Equal(o.due) {
		return e.due.Before(o.due)
	}
	return e.seq < o.seq
}

func (e *entry) notify() {
	close(e.changed)
	e.changed = make(chan struct{})
}

func (m *Manager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// fetch makes a key and a CSR, asks the CA and records the outcome.
func (m *Manager) fetch(ctx context.Context, e *entry) {
	start := time.Now()
	cert, chain, err := m.obtain(ctx, e.id)
	// Refresh at half the remaining lifetime as seen from when we asked
	// (the CA backdates NotBefore for clock skew).
	var issued time.Time
	var lifetime, margin time.Duration
	if err == nil {
		issued = start
		if cert.Leaf.NotBefore.After(issued) {
			issued = cert.Leaf.NotBefore
		}
		lifetime = cert.Leaf.NotAfter.Sub(issued)
		margin = ExpiryMargin(lifetime)
		if now := m.opts.Clock(); !now.Add(margin).Before(cert.Leaf.NotAfter) {
			// Get would not hand it out (and would ask again at once).
			err = fmt.Errorf("certificate for %s expires at %s, within %v of this clock's %s (is this clock ahead?)",
				e.id, cert.Leaf.NotAfter.UTC().Format(time.RFC3339), margin, now.UTC().Format(time.RFC3339))
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inFlight--
	m.poke()
	e.fetching = false
	e.attempts++
	if e.gone {
		return
	}
	if err != nil {
		if ctx.Err() != nil {
			// Shutting down: not the CA's fault, no backoff to compute.
			e.lastErr = fmt.Errorf("%w: %v", ErrStopped, err)
			e.notify()
			return
		}
		e.lastErr = err
		e.backoff = min(max(e.backoff*2, m.opts.InitialBackoff), m.opts.MaxBackoff)
		// While the certificate in use serves, retry at least twice in what
		// is left of it: a backoff grown over a long outage must not
		// outlast the certificate when the CA comes back before that.
		left := time.Duration(0)
		if e.cert != nil {
			left = e.servingUntil().Sub(m.opts.Clock())
		}
		if left > 0 {
			e.backoff = max(min(e.backoff, left/2), minRefreshDelay)
		}
		wait := jitter(e.backoff, 0.8, 1.2)
		wait = min(wait, m.opts.MaxBackoff)
		e.due = time.Now().Add(wait)
		fields := []zap.Field{zap.Stringer("identity", e.id), zap.Duration("retry_in", wait), zap.Error(err)}
		if left > 0 {
			fields = append(fields, zap.Time("serving_until", e.servingUntil()))
		}
		m.log.Warn("certificate fetch failed", fields...)
		e.notify()
		return
	}
	e.cert, e.chain, e.margin, e.lastErr, e.backoff = cert, chain, margin, nil, 0
	// A little earlier than half by jitter, so that identities fetched
	// together spread out.
	e.due = issued.Add(jitter(lifetime/2, 0.8, 1.0))
	// A CA handing out very short certificates over a slow link must not
	// turn refreshing into a tight loop.
	if floor := time.Now().Add(minRefreshDelay); e.due.Before(floor) {
		e.due = floor
	}
	m.log.Info("certificate fetched", zap.Stringer("identity", e.id),
		zap.String("serial", cert.Leaf.SerialNumber.Text(16)), zap.Time("not_after", cert.Leaf.NotAfter),
		zap.Time("refresh_at", e.due))
	m.updateBundleLocked(chain)
	e.notify()
	// The CA answers again: identities waiting out a backoff grown while
	// it did not retry now (spread out) instead of at its end.
	now := time.Now()
	for _, o := range m.entries {
		if o != e && o.lastErr != nil && !o.fetching && o.due.After(now.Add(retrySpread)) {
			o.due = now.Add(jitter(retrySpread, 0, 1))
		}
	}
	m.poke()
}

// servingUntil is when the entry's certificate stops being handed out.
func (e *entry) servingUntil() time.Time { return e.cert.Leaf.NotAfter.Add(-e.margin) }

// servesLocked reports whether the entry holds a certificate to hand out
// at now (by the manager's clock).
func (e *entry) servesLocked(now time.Time) bool {
	return e.cert != nil && now.Before(e.servingUntil())
}

// obtain runs one fetch without holding the lock.
func (m *Manager) obtain(ctx context.Context, id trust.Identity) (*tls.Certificate, []*x509.Certificate, error) {
	key, csr, err := trust.NewKeyAndCSR(id)
	if err != nil {
		return nil, nil, err
	}
	fctx, cancel := context.WithTimeout(ctx, m.opts.FetchTimeout)
	defer cancel()
	pemChain, err := m.opts.Fetcher.Fetch(fctx, id, csr, m.opts.TTL)
	if err != nil {
		return nil, nil, err
	}
	cert, err := trust.TLSCertificate(pemChain, key)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate for %s: %w", id, err)
	}
	if len(cert.Leaf.URIs) != 1 || cert.Leaf.URIs[0].String() != id.String() {
		return nil, nil, fmt.Errorf("certificate for %s names %v", id, cert.Leaf.URIs)
	}
	// Judged by our clock: one ahead of the CA's sees the new certificate
	// expired (refused; the one held, if any, keeps serving while valid).
	// One behind sees it not yet valid: peers judge it, by their clocks,
	// so it is used, with a warning (our verification of peers will fail).
	now := m.opts.Clock()
	var te *trust.CertificateTimeError
	if err := trust.CheckValidity(cert.Leaf, now); errors.As(err, &te) {
		if !te.NotYetValid() {
			return nil, nil, fmt.Errorf("certificate for %s: %w", id, err)
		}
		m.log.Warn("certificate from the CA not yet valid by this clock", zap.Stringer("identity", id),
			zap.Duration("skew", te.Skew()), zap.Error(err))
	}
	var all []*x509.Certificate
	for i, p := range pemChain {
		certs, err := trust.ParseCertificatesPEM([]byte(p))
		if err != nil {
			return nil, nil, fmt.Errorf("certificate for %s: chain element %d: %w", id, i, err)
		}
		all = append(all, certs...)
	}
	return cert, all, nil
}

// updateBundleLocked replaces the bundle's roots with the roots the CA sent,
// if they differ.
func (m *Manager) updateBundleLocked(chain []*x509.Certificate) {
	if m.opts.Bundle == nil {
		return
	}
	var roots []*x509.Certificate
	for i := len(chain) - 1; i > 0; i-- {
		c := chain[i]
		if !c.IsCA || c.CheckSignatureFrom(c) != nil {
			break
		}
		roots = append(roots, c)
	}
	if len(roots) == 0 {
		return
	}
	slices.Reverse(roots)
	cur := m.opts.Bundle.Roots()
	if slices.EqualFunc(cur, roots, func(a, b *x509.Certificate) bool { return a.Equal(b) }) {
		return
	}
	if err := m.opts.Bundle.SetRoots(roots); err != nil {
		m.log.Error("trust bundle from the CA rejected", zap.Error(err))
		return
	}
	m.log.Info("trust bundle updated from the CA", zap.Int("roots", len(roots)))
}

func pemEncode(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func jitter(d time.Duration, lo, hi float64) time.Duration {
	return time.Duration(float64(d) * (lo + rand.Float64()*(hi-lo)))
}

// ensureLocked returns the entry for id, creating it (due now) if needed.
func (m *Manager) ensureLocked(id trust.Identity) *entry {
	e, ok := m.entries[id]
	if !ok {
		m.seq++
		e = &entry{id: id, seq: m.seq, changed: make(chan struct{})}
		m.entries[id] = e
		m.poke()
	}
	return e
}

// Prefetch starts getting a certificate for id at low priority (a workload
// with that identity was scheduled on the node). It does not wait.
func (m *Manager) Prefetch(id trust.Identity) {
	if id.IsZero() {
		return
	}
	m.mu.Lock()
	m.ensureLocked(id)
	m.mu.Unlock()
}

// Get returns a valid certificate for id, fetching it at high priority if
// there is none; one within a tenth of its life (at most 10 s) of expiry
// no longer counts, so that it does not expire during the handshake: it waits for the fetch in progress or next in line, until
// ctx ends. While id is backing off after a failure and holds no valid
// certificate, Get fails at once with that failure rather than waiting.
func (m *Manager) Get(ctx context.Context, id trust.Identity) (*tls.Certificate, error) {
	if id.IsZero() {
		return nil, errors.New("certificate: no identity")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.ensureLocked(id)
	waiting := false
	defer func() {
		if waiting {
			e.waiters--
		}
	}()
	var seen uint64
	for {
		now := time.Now()
		if e.servesLocked(m.opts.Clock()) {
			return e.cert, nil
		}
		if e.gone {
			return nil, fmt.Errorf("certificate for %s: identity forgotten", id)
		}
		if m.stopped {
			return nil, fmt.Errorf("certificate for %s: %w", id, ErrStopped)
		}
		if e.lastErr != nil && (waiting && e.attempts > seen || !e.fetching && e.due.After(now)) {
			return nil, fmt.Errorf("certificate for %s unavailable: %w", id, e.lastErr)
		}
		if !e.fetching && e.due.After(now) {
			// Nothing to hand out before the refresh is due: the held
			// certificate is within its margin of expiry, or outside its
			// validity by our clock. Fetch now.
			e.due = now
			m.poke()
		}
		if !waiting {
			waiting, seen = true, e.attempts
			e.waiters++
			m.poke() // re-rank: we may now outrank queued prefetches
		}
		changed := e.changed
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			m.mu.Lock()
			return nil, fmt.Errorf("certificate for %s: %w", id, ctx.Err())
		case <-changed:
		}
		m.mu.Lock()
	}
}

// Forget drops id (its last workload left the node): no more refreshes,
// waiting Get calls fail, a fetch in flight is discarded.
func (m *Manager) Forget(id trust.Identity) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.entries[id]; ok {
		delete(m.entries, id)
		e.gone = true
		e.notify()
		m.poke()
	}
}

// CertificateStatus is one identity in the admin dump (docs/design.md §8).
type CertificateStatus struct {
	Identity  string            `json:"identity"`
	State     string            `json:"state"`
	CertChain []CertificateInfo `json:"cert_chain"`
	// RefreshError is why the last refresh failed while the certificate
	// in use is still valid (State stays Available until it expires).
	RefreshError string `json:"refresh_error,omitempty"`
}

// CertificateInfo is one element of a chain, leaf first, roots last.
type CertificateInfo struct {
	PEM            string `json:"pem"`
	SerialNumber   string `json:"serial_number"`   // hexadecimal
	ValidFrom      string `json:"valid_from"`      // RFC 3339
	ExpirationTime string `json:"expiration_time"` // RFC 3339
}

// ChainInfo describes a chain as Snapshot does.
func ChainInfo(chain []*x509.Certificate) []CertificateInfo {
	out := make([]CertificateInfo, 0, len(chain))
	for _, c := range chain {
		out = append(out, CertificateInfo{
			PEM:            string(pemEncode(c.Raw)),
			SerialNumber:   c.SerialNumber.Text(16),
			ValidFrom:      c.NotBefore.UTC().Format(time.RFC3339),
			ExpirationTime: c.NotAfter.UTC().Format(time.RFC3339),
		})
	}
	return out
}

// Snapshot returns every identity's state and chain, sorted by identity.
func (m *Manager) Snapshot() []CertificateStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]CertificateStatus, 0, len(m.entries))
	for _, e := range m.entries {
		s := CertificateStatus{Identity: e.id.String(), State: e.stateLocked(m.opts.Clock()), CertChain: []CertificateInfo{}}
		if e.lastErr != nil && s.State == StateAvailable {
			s.RefreshError = e.lastErr.Error()
		}
		s.CertChain = append(s.CertChain, ChainInfo(e.chain)...)
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b CertificateStatus) int {
		switch {
		case a.Identity < b.Identity:
			return -1
		case a.Identity > b.Identity:
			return 1
		}
		return 0
	})
	return out
}

// stateLocked: a certificate that is still valid serves, so its identity is
// Available however its refreshes fare (readiness follows this state; a
// CA outage shorter than the remaining lifetime must not take the proxy
// out of service); Unavailable only once nothing is held that Get would
// hand out.
func (e *entry) stateLocked(now time.Time) string {
	switch {
	case e.servesLocked(now):
		return StateAvailable
	case e.lastErr != nil:
		return StateUnavailable + ": " + e.lastErr.Error()
	default:
		return StateInitializing
	}
}
