package tokenreview_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/causeway-mesh/causeway/pkg/trust/authn"
	"github.com/causeway-mesh/causeway/pkg/trust/authn/tokenreview"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

// reviewAPI answers TokenReviews from a table and counts the calls; a
// slow answer lets concurrent callers pile up.
type reviewAPI struct {
	calls   atomic.Int32
	delay   time.Duration
	mu      sync.Mutex
	answers map[string]authnv1.TokenReviewStatus
}

func (r *reviewAPI) Create(_ context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	r.calls.Add(1)
	time.Sleep(r.delay)
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.answers[tr.Spec.Token]
	if !ok {
		st = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
	}
	return &authnv1.TokenReview{Status: st}, nil
}

type podTable map[string]tokenreview.PodInfo

func (p podTable) Pod(ns, name string) (tokenreview.PodInfo, bool, error) {
	i, ok := p[ns+"/"+name]
	return i, ok, nil
}

// jwtWithExpiry makes a token-shaped string whose payload has exp; the
// review API (here the table) is what decides whether it is valid.
func jwtWithExpiry(name string, exp time.Time) string {
	payload := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"exp":%d,"name":%q}`, exp.Unix(), name))
	return "eyJhbGciOiJSUzI1NiJ9." + payload + ".c2ln"
}

func nodeProxyAnswer(audience, podUID string) authnv1.TokenReviewStatus {
	return authnv1.TokenReviewStatus{
		Authenticated: true,
		Audiences:     []string{audience},
		User: authnv1.UserInfo{
			Username: "system:serviceaccount:causeway-system:nodeproxy",
			Extra: map[string]authnv1.ExtraValue{
				tokenreview.ExtraPodName: {"nodeproxy-x"}, tokenreview.ExtraPodUID: {podUID},
			},
		},
	}
}

func TestTokenReviewCachesPositiveReviewsOnly(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	long := jwtWithExpiry("long", now.Add(time.Hour))
	short := jwtWithExpiry("short", now.Add(10*time.Second))
	api := &reviewAPI{answers: map[string]authnv1.TokenReviewStatus{
		long:  nodeProxyAnswer(tokenreview.DefaultAudience, "uid-1"),
		short: nodeProxyAnswer(tokenreview.DefaultAudience, "uid-1"),
	}}
	pods := podTable{"causeway-system/nodeproxy-x": {UID: "uid-1", Node: "node-a"}}
	a, err := tokenreview.New(tokenreview.Options{Reviews: api, TrustDomain: "cluster.local", Pods: pods, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.Authenticate(trusttest.Bearer(long))
	if err != nil {
		t.Fatal(err)
	}
	if c.Account.String() != "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy" || c.Node != "node-a" || c.Pod != "causeway-system/nodeproxy-x" {
		t.Fatalf("caller %+v", c)
	}
	if _, err := a.Authenticate(trusttest.Bearer(long)); err != nil || api.calls.Load() != 1 {
		t.Fatalf("second call: err %v, %d reviews; want the cached review", err, api.calls.Load())
	}
	now = now.Add(tokenreview.DefaultCacheTTL + time.Second)
	if _, err := a.Authenticate(trusttest.Bearer(long)); err != nil || api.calls.Load() != 2 {
		t.Fatalf("after the cache bound: err %v, %d reviews; want a new review", err, api.calls.Load())
	}

	// A token expiring before the bound is reused only until it expires.
	if _, err := a.Authenticate(trusttest.Bearer(short)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(11 * time.Second)
	delete(api.answers, short) // expired, the API would now refuse it
	_, err = a.Authenticate(trusttest.Bearer(short))
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "invalid bearer token")

	// Failures are not cached: once the API accepts the token, so do we.
	bad := jwtWithExpiry("bad", now.Add(time.Hour))
	before := api.calls.Load()
	for range 2 {
		_, err = a.Authenticate(trusttest.Bearer(bad))
		trusttest.WantError(t, err, authn.ErrInvalidCredentials, "token review: invalid bearer token")
	}
	if n := api.calls.Load() - before; n != 2 {
		t.Fatalf("%d reviews for two refused calls, want 2 (failures not cached)", n)
	}
	api.answers[bad] = nodeProxyAnswer(tokenreview.DefaultAudience, "uid-1")
	if _, err := a.Authenticate(trusttest.Bearer(bad)); err != nil {
		t.Fatalf("after the API accepts it: %v", err)
	}

	// The pod check runs on every call, cached review or not.
	pods["causeway-system/nodeproxy-x"] = tokenreview.PodInfo{UID: "uid-2", Node: "node-a"}
	_, err = a.Authenticate(trusttest.Bearer(long))
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "uid uid-1, which no longer exists (the pod of that name has uid uid-2)")
	delete(pods, "causeway-system/nodeproxy-x")
	_, err = a.Authenticate(trusttest.Bearer(long))
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "which does not exist")
}

func TestTokenReviewRefusals(t *testing.T) {
	tok := jwtWithExpiry("t", time.Now().Add(time.Hour))
	for _, tc := range []struct {
		name   string
		answer authnv1.TokenReviewStatus
		want   string
	}{
		{"other audience", nodeProxyAnswer("kubernetes", "uid-1"), `not for audience causeway-ca (it is for ["kubernetes"])`},
		{"not a service account", authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"causeway-ca"}, User: authnv1.UserInfo{Username: "alice"}}, `"alice" is not a service account`},
		{"pod name without uid", authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"causeway-ca"}, User: authnv1.UserInfo{
			Username: "system:serviceaccount:a:b", Extra: map[string]authnv1.ExtraValue{tokenreview.ExtraPodName: {"p"}}}}, "both or neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := &reviewAPI{answers: map[string]authnv1.TokenReviewStatus{tok: tc.answer}}
			a, err := tokenreview.New(tokenreview.Options{Reviews: api, TrustDomain: "cluster.local", Pods: podTable{}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = a.Authenticate(trusttest.Bearer(tok))
			trusttest.WantError(t, err, authn.ErrInvalidCredentials, tc.want)
		})
	}
}

// Concurrent calls with one token share one review.
func TestTokenReviewSharesConcurrentReviews(t *testing.T) {
	tok := jwtWithExpiry("t", time.Now().Add(time.Hour))
	api := &reviewAPI{delay: 100 * time.Millisecond, answers: map[string]authnv1.TokenReviewStatus{tok: nodeProxyAnswer("causeway-ca", "uid-1")}}
	a, err := tokenreview.New(tokenreview.Options{Reviews: api, TrustDomain: "cluster.local",
		Pods: podTable{"causeway-system/nodeproxy-x": {UID: "uid-1", Node: "n"}}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := a.Authenticate(trusttest.Bearer(tok)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := api.calls.Load(); n != 1 {
		t.Fatalf("%d reviews for 20 concurrent calls, want 1", n)
	}
}
