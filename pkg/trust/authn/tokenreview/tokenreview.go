// Package tokenreview authenticates Kubernetes service-account tokens with
// the TokenReview API, for the control plane's CA and xDS server. It is a
// package of its own so that the node proxy and the waypoint, which use
// only package authn's types, do not link client-go.
package tokenreview

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
)

// Keys of a bound token's user.extra that name the pod it is bound to.
const (
	ExtraPodName = "authentication.kubernetes.io/pod-name"
	ExtraPodUID  = "authentication.kubernetes.io/pod-uid"
)

// DefaultAudience is the audience of the projected service-account tokens
// that node proxies and waypoints present to the control plane.
const DefaultAudience = "causeway-ca"

const (
	// DefaultCacheTTL bounds how long a positive review is reused.
	DefaultCacheTTL = time.Minute
	// maxReviewCache bounds the cached reviews (one per live token).
	maxReviewCache = 10000
	// reviewTimeout bounds one TokenReview call.
	reviewTimeout = 10 * time.Second
	// maxClaims bounds the JWT payload read for its expiry (authn.BearerToken
	// already bounds the whole token).
	maxClaims = 8 << 10
)

// PodInfo is what the control plane knows of a pod.
type PodInfo struct {
	UID  string
	Node string // spec.nodeName; "" while unscheduled
}

// PodLookup is the control plane's view of the cluster's pods (an informer).
type PodLookup interface {
	// Pod returns pod namespace/name. found is false when there is no such
	// pod; err is set when the view cannot answer yet (not synced).
	Pod(namespace, name string) (info PodInfo, found bool, err error)
}

// Options configure an Authenticator.
type Options struct {
	// Reviews is the TokenReview API (clientset.AuthenticationV1().TokenReviews()). Required.
	Reviews authnv1client.TokenReviewInterface
	// Audiences a token must be issued for (default DefaultAudience).
	Audiences []string
	// TrustDomain of the callers' identities. Required.
	TrustDomain string
	// Pods checks that the pod a token is bound to still exists with the
	// uid the token names, and gives the caller's node. Without it no
	// caller has a node, so none may impersonate.
	Pods PodLookup
	// CacheTTL bounds how long a positive review is reused (default
	// DefaultCacheTTL); never beyond the token's expiry. Failures are
	// never cached.
	CacheTTL time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Authenticator authenticates Kubernetes service-account tokens with the
// TokenReview API (authentication.k8s.io/v1), audiences set, as the CA and
// xDS server do in a cluster. The caller's account comes from the username
// (system:serviceaccount:<ns>:<sa>); a token bound to a pod is accepted only
// while that pod exists with the uid the token names, and the caller's node
// is that pod's node.
type Authenticator struct {
	reviews   authnv1client.TokenReviewInterface
	audiences []string
	td        string
	pods      PodLookup
	ttl       time.Duration
	now       func() time.Time

	flight singleflight.Group
	mu     sync.Mutex
	cache  map[[sha256.Size]byte]reviewed
}

// reviewed is a positive review: who the token names, until when.
type reviewed struct {
	account trust.Identity
	podName string
	podUID  string
	expires time.Time
}

// New returns an Authenticator.
func New(o Options) (*Authenticator, error) {
	if o.Reviews == nil {
		return nil, errors.New("token review: no TokenReview client")
	}
	if _, err := trust.NewIdentity(o.TrustDomain, "ns", "sa"); err != nil {
		return nil, fmt.Errorf("token review: %w", err)
	}
	if len(o.Audiences) == 0 {
		o.Audiences = []string{DefaultAudience}
	}
	if o.CacheTTL <= 0 {
		o.CacheTTL = DefaultCacheTTL
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Authenticator{
		reviews: o.Reviews, audiences: slices.Clone(o.Audiences), td: o.TrustDomain, pods: o.Pods,
		ttl: o.CacheTTL, now: o.Now, cache: map[[sha256.Size]byte]reviewed{},
	}, nil
}

// Authenticate implements authn.Authenticator for "authorization: Bearer <token>".
func (a *Authenticator) Authenticate(ctx context.Context) (authn.Caller, error) {
	token, err := authn.BearerToken(ctx)
	if err != nil {
		return authn.Caller{}, err
	}
	r, err := a.review(ctx, token)
	if err != nil {
		return authn.Caller{}, err
	}
	c := authn.Caller{Account: r.account}
	if r.podName == "" {
		return c, nil // not bound to a pod: its own identity only
	}
	c.Pod = r.account.Namespace() + "/" + r.podName
	if a.pods == nil {
		return c, nil
	}
	// Checked on every call, cached review or not: a deleted pod's token
	// stops working as soon as the control plane sees the deletion.
	info, found, err := a.pods.Pod(r.account.Namespace(), r.podName)
	switch {
	case err != nil:
		return authn.Caller{}, fmt.Errorf("cannot check the pod the token is bound to: %w", err)
	case !found:
		return authn.Caller{}, fmt.Errorf("%w: token is bound to pod %s (uid %s), which does not exist", authn.ErrInvalidCredentials, c.Pod, r.podUID)
	case info.UID != r.podUID:
		return authn.Caller{}, fmt.Errorf("%w: token is bound to pod %s uid %s, which no longer exists (the pod of that name has uid %s)",
			authn.ErrInvalidCredentials, c.Pod, r.podUID, info.UID)
	}
	c.Node = info.Node
	return c, nil
}

// review returns the cached review of token or asks the API, once for
// concurrent callers with the same token.
func (a *Authenticator) review(ctx context.Context, token string) (reviewed, error) {
	key := sha256.Sum256([]byte(token))
	now := a.now()
	a.mu.Lock()
	r, ok := a.cache[key]
	if ok && now.After(r.expires) {
		delete(a.cache, key)
		ok = false
	}
	a.mu.Unlock()
	if ok {
		return r, nil
	}
	v, err, _ := a.flight.Do(string(key[:]), func() (any, error) {
		// Not the caller's context: one caller giving up must not fail the
		// others waiting on the same review.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		return a.ask(rctx, token)
	})
	if err != nil {
		return reviewed{}, err
	}
	r = v.(reviewed)
	if !r.expires.IsZero() {
		a.store(key, r)
	}
	return r, nil
}

// ask performs one TokenReview and checks its answer.
func (a *Authenticator) ask(ctx context.Context, token string) (reviewed, error) {
	resp, err := a.reviews.Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: a.audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return reviewed{}, fmt.Errorf("token review: %w", err)
	}
	st := resp.Status
	if !st.Authenticated {
		why := st.Error
		if why == "" {
			why = "not authenticated"
		}
		return reviewed{}, fmt.Errorf("%w: token review: %s", authn.ErrInvalidCredentials, why)
	}
	// The API checks the audiences it was given; a server that ignored
	// them (an old or odd authenticator) answers none of ours.
	if !slices.ContainsFunc(st.Audiences, func(s string) bool { return slices.Contains(a.audiences, s) }) {
		return reviewed{}, fmt.Errorf("%w: token is not for audience %s (it is for %q)",
			authn.ErrInvalidCredentials, strings.Join(a.audiences, ","), st.Audiences)
	}
	rest, ok := strings.CutPrefix(st.User.Username, "system:serviceaccount:")
	ns, sa, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 {
		return reviewed{}, fmt.Errorf("%w: %q is not a service account", authn.ErrInvalidCredentials, st.User.Username)
	}
	id, err := trust.NewIdentity(a.td, ns, sa)
	if err != nil {
		return reviewed{}, fmt.Errorf("%w: %v", authn.ErrInvalidCredentials, err)
	}
	r := reviewed{account: id, podName: single(st.User.Extra[ExtraPodName]), podUID: single(st.User.Extra[ExtraPodUID])}
	if (r.podName == "") != (r.podUID == "") {
		return reviewed{}, fmt.Errorf("%w: token names pod %q with uid %q: both or neither must be set", authn.ErrInvalidCredentials, r.podName, r.podUID)
	}
	// Reuse for the short bound, never past the token's own expiry; a
	// token whose expiry cannot be read is not reused at all.
	if exp, ok := tokenExpiry(token); ok {
		r.expires = a.now().Add(a.ttl)
		if exp.Before(r.expires) {
			r.expires = exp
		}
	}
	return r, nil
}

func (a *Authenticator) store(key [sha256.Size]byte, r reviewed) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cache) >= maxReviewCache {
		now := a.now()
		for k, v := range a.cache {
			if now.After(v.expires) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= maxReviewCache {
			return // full of live tokens: review every call rather than grow
		}
	}
	a.cache[key] = r
}

func single(v authnv1.ExtraValue) string {
	if len(v) != 1 {
		return ""
	}
	return v[0]
}

// tokenExpiry reads the exp claim of a JWT without verifying it: the API
// server has verified the token; the claim only shortens how long its
// review is reused.
func tokenExpiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || len(parts[1]) > maxClaims {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *json.Number `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	secs, err := claims.Exp.Int64()
	if err != nil || secs <= 0 {
		return time.Time{}, false
	}
	return time.Unix(secs, 0), true
}
