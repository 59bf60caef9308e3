// Package caserver is the mesh CA as a gRPC service, wire-compatible with
// Istio's istio.v1.auth.IstioCertificateService, so ztunnel-style clients
// can use it. It authenticates callers (authn), authorizes the identity they
// ask for (node authorization, docs/design.md §3) and signs their CSRs.
package caserver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
)

// ImpersonatedIdentityKey is the request metadata field with which a node
// proxy asks for the identity of a workload on its node (as ztunnel does).
const ImpersonatedIdentityKey = "ImpersonatedIdentity"

// maxCSRSize bounds the CSR a caller may send; a P-256 CSR is under 1 KiB.
const maxCSRSize = 64 << 10

// Options configure a Server.
type Options struct {
	// Authority signs the certificates. Required.
	Authority *trust.Authority
	// TrustDomain is the only trust domain the CA issues for. Required.
	TrustDomain string
	// Authenticator establishes the caller of each request. Required.
	Authenticator authn.Authenticator
	// TrustedNodeAccounts are the accounts (node proxies) allowed to ask
	// for the identities of workloads on their own node.
	TrustedNodeAccounts []trust.Identity
	// Workloads says which identities run on which node. Required when
	// TrustedNodeAccounts is not empty.
	Workloads trust.WorkloadIndex
	// WorkloadWait bounds how long a node proxy's request for a workload
	// not (yet) on its node waits for the workload index to change before
	// it is refused, when the index says when it changes
	// (trust.WorkloadChanges): a pod's first request can arrive before the
	// configuration holds the pod. 0: refused at once.
	WorkloadWait time.Duration
	// DefaultTTL is the lifetime granted when a request names none
	// (default trust.DefaultCertTTL); requests are capped at the
	// authority's maximum.
	DefaultTTL time.Duration
	// Logger records every issuance and refusal (default: none).
	Logger *zap.Logger
	// Registerer receives the server's metrics (default: not registered).
	Registerer prometheus.Registerer
}

// Server implements istio.v1.auth.IstioCertificateService.
type Server struct {
	securityapi.UnimplementedIstioCertificateServiceServer

	authority  *trust.Authority
	td         string
	authn      authn.Authenticator
	trusted    map[trust.Identity]bool
	workloads  trust.WorkloadIndex
	wait       time.Duration
	defaultTTL time.Duration
	log        *zap.Logger
	issued     prometheus.Counter
	refused    *prometheus.CounterVec
}

// New checks the options and returns a server.
func New(o Options) (*Server, error) {
	if o.Authority == nil {
		return nil, errors.New("CA server: no authority")
	}
	if o.Authenticator == nil {
		return nil, errors.New("CA server: no authenticator")
	}
	probe, err := trust.NewIdentity(o.TrustDomain, "ns", "sa")
	if err != nil {
		return nil, fmt.Errorf("CA server: %w", err)
	}
	td := probe.TrustDomain().Name()
	trusted := map[trust.Identity]bool{}
	for _, a := range o.TrustedNodeAccounts {
		if a.IsZero() || a.TrustDomain().Name() != td {
			return nil, fmt.Errorf("CA server: trusted node account %q is not in trust domain %s", a, td)
		}
		trusted[a] = true
	}
	if len(trusted) > 0 && o.Workloads == nil {
		return nil, errors.New("CA server: trusted node accounts need a workload index")
	}
	if o.DefaultTTL <= 0 {
		o.DefaultTTL = trust.DefaultCertTTL
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	s := &Server{
		authority:  o.Authority,
		td:         td,
		authn:      o.Authenticator,
		trusted:    trusted,
		workloads:  o.Workloads,
		wait:       o.WorkloadWait,
		defaultTTL: min(o.DefaultTTL, o.Authority.MaxTTL()),
		log:        o.Logger.Named("ca"),
		issued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "causeway_ca_certificates_issued_total", Help: "Workload certificates issued.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "causeway_ca_refusals_total", Help: "Certificate requests refused, by gRPC status code (Unauthenticated, PermissionDenied, InvalidArgument, Unavailable, ...).",
		}, []string{"code"}),
	}
	for _, c := range []codes.Code{codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument, codes.Unavailable} {
		s.refused.WithLabelValues(c.String()) // every common series exists from the start
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{s.issued, s.refused} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("CA server metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Register puts the service on a gRPC server (the control plane's, on
// 15012 next to xDS). That server must use TLS; for mesh-certificate
// callers it must verify client certificates (trust.ServerConfig).
func (s *Server) Register(r grpc.ServiceRegistrar) {
	securityapi.RegisterIstioCertificateServiceServer(r, s)
}

// CreateCertificate authenticates the caller, decides which identity it may
// have, checks that the CSR asks for exactly that identity and signs it.
func (s *Server) CreateCertificate(ctx context.Context, req *securityapi.IstioCertificateRequest) (*securityapi.IstioCertificateResponse, error) {
	remote := "unknown"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		remote = p.Addr.String()
	}
	caller, err := s.authn.Authenticate(ctx)
	if err != nil {
		st := authn.StatusError(err)
		s.refused.WithLabelValues(status.Code(st).String()).Inc()
		s.log.Warn("certificate refused", zap.String("remote", remote), zap.String("caller", "unauthenticated"),
			zap.Stringer("code", status.Code(st)), zap.Error(err))
		return nil, st
	}
	id, impersonating, err := s.grant(ctx, caller, req.GetMetadata())
	if err == nil {
		var chain []string
		chain, err = s.sign(id, req)
		if err == nil {
			s.issued.Inc()
			s.logIssued(caller, remote, id, impersonating, chain)
			return &securityapi.IstioCertificateResponse{CertChain: chain}, nil
		}
	}
	s.refused.WithLabelValues(status.Code(err).String()).Inc()
	fields := []zap.Field{zap.String("remote", remote), zap.Stringer("caller", caller.Account),
		zap.String("pod", caller.Pod), zap.String("node", caller.Node), zap.Stringer("code", status.Code(err)), zap.String("reason", status.Convert(err).Message())}
	if !id.IsZero() {
		fields = append(fields, zap.Stringer("identity", id))
	}
	s.log.Warn("certificate refused", fields...)
	return nil, err
}

// grant decides which identity the caller may have. Without impersonation
// that is its own account; with it, the caller must be a trusted node
// account, a workload with that identity must run on the caller's node, and
// the identity must not be a waypoint's.
func (s *Server) grant(ctx context.Context, caller authn.Caller, md *structpb.Struct) (id trust.Identity, impersonating bool, _ error) {
	if caller.Account.IsZero() || caller.Account.TrustDomain().Name() != s.td {
		return trust.Identity{}, false, status.Errorf(codes.PermissionDenied,
			"account %q is not in trust domain %s", caller.Account, s.td)
	}
	v, ok := md.GetFields()[ImpersonatedIdentityKey]
	if !ok {
		return caller.Account, false, nil
	}
	sv, ok := v.GetKind().(*structpb.Value_StringValue)
	if !ok {
		return trust.Identity{}, false, status.Errorf(codes.InvalidArgument, "metadata %s must be a string", ImpersonatedIdentityKey)
	}
	if sv.StringValue == "" {
		return caller.Account, false, nil
	}
	want, err := trust.ParseIdentity(sv.StringValue)
	if err != nil {
		return trust.Identity{}, false, status.Errorf(codes.InvalidArgument, "metadata %s: %v", ImpersonatedIdentityKey, err)
	}
	if want == caller.Account {
		return want, false, nil
	}
	if want.TrustDomain().Name() != s.td {
		return want, true, status.Errorf(codes.PermissionDenied, "identity %s is not in trust domain %s", want, s.td)
	}
	if !s.trusted[caller.Account] {
		return want, true, status.Errorf(codes.PermissionDenied,
			"account %s is not a trusted node account and may not impersonate %s", caller.Account, want)
	}
	if caller.Node == "" {
		return want, true, status.Errorf(codes.PermissionDenied,
			"account %s authenticated without a node name and may not impersonate %s", caller.Account, want)
	}
	if s.workloads.IsWaypoint(want) {
		// Whatever the configuration says runs on the node: a node proxy
		// holding it could pass as the waypoint to the pods behind it.
		return want, true, status.Errorf(codes.PermissionDenied,
			"identity %s belongs to a waypoint; only the waypoint's own pods may hold it, never a node proxy", want)
	}
	if waited, ok := s.hasWorkload(ctx, caller.Node, want); !ok {
		return want, true, status.Errorf(codes.PermissionDenied, "no workload with identity %s on node %s%s", want, caller.Node, waitedFor(waited))
	} else if waited > 0 {
		s.log.Debug("workload seen after waiting for the configuration", zap.Stringer("identity", want),
			zap.String("node", caller.Node), zap.Duration("waited", waited))
	}
	return want, true, nil
}

// hasWorkload asks the workload index, and while it says no and can say
// when it changes, asks again at each change for up to the server's
// WorkloadWait (or until the caller gives up): how long it waited, and the
// answer.
func (s *Server) hasWorkload(ctx context.Context, node string, id trust.Identity) (time.Duration, bool) {
	if s.workloads.HasWorkload(node, id) {
		return 0, true
	}
	changes, ok := s.workloads.(trust.WorkloadChanges)
	if !ok || s.wait <= 0 {
		return 0, false
	}
	start := time.Now()
	timeout := time.NewTimer(s.wait)
	defer timeout.Stop()
	for {
		changed := changes.Changed() // before asking: a change after the answer is not missed
		if s.workloads.HasWorkload(node, id) {
			return time.Since(start), true
		}
		select {
		case <-changed:
		case <-timeout.C:
			return time.Since(start), false
		case <-ctx.Done():
			return time.Since(start), false
		}
	}
}

// waitedFor is the refusal's note of a wait for the configuration.
func waitedFor(d time.Duration) string {
	if d < time.Millisecond {
		return ""
	}
	return fmt.Sprintf(" (none appeared in %s)", d.Round(time.Millisecond))
}

func (s *Server) sign(id trust.Identity, req *securityapi.IstioCertificateRequest) ([]string, error) {
	if len(req.GetCsr()) > maxCSRSize {
		return nil, status.Errorf(codes.InvalidArgument, "CSR larger than %d bytes", maxCSRSize)
	}
	csr, err := trust.ParseCSR([]byte(req.GetCsr()))
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := trust.CheckCSR(csr, id); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ttl := s.defaultTTL
	switch secs := req.GetValidityDuration(); {
	case secs < 0:
		return nil, status.Errorf(codes.InvalidArgument, "validity_duration %d is negative", secs)
	case secs > int64(s.authority.MaxTTL()/time.Second):
		ttl = s.authority.MaxTTL() // capped, as the issue asks, rather than refused
	case secs > 0:
		ttl = time.Duration(secs) * time.Second
	}
	chain, err := s.authority.Sign(csr, id, ttl)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return chain, nil
}

func (s *Server) logIssued(caller authn.Caller, remote string, id trust.Identity, impersonating bool, chain []string) {
	fields := []zap.Field{zap.Stringer("identity", id), zap.Stringer("caller", caller.Account),
		zap.String("node", caller.Node), zap.String("remote", remote), zap.Bool("impersonated", impersonating)}
	if certs, err := trust.ParseCertificatesPEM([]byte(chain[0])); err == nil {
		fields = append(fields, zap.String("serial", certs[0].SerialNumber.Text(16)),
			zap.Time("not_after", certs[0].NotAfter))
	}
	s.log.Info("certificate issued", fields...)
}
