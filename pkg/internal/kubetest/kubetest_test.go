package kubetest_test

import (
	"context"
	"os"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// The apiserver issues and reviews service-account tokens, and accepts a
// token signed with its key only while it has not expired.
func TestTokens(t *testing.T) {
	env := kubetest.Shared(t)
	c := env.Clientset(t)
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kubetest"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa, err := c.CoreV1().ServiceAccounts("kubetest").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.CoreV1().ServiceAccounts("kubetest").CreateToken(ctx, "sa", &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{"test"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	review := func(token string) authnv1.TokenReviewStatus {
		t.Helper()
		r, err := c.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
			Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{"test"}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status
	}
	if st := review(tr.Status.Token); !st.Authenticated || st.User.Username != "system:serviceaccount:kubetest:sa" {
		t.Fatalf("issued token: %+v", st)
	}
	claims := func(exp time.Time) map[string]any {
		return map[string]any{
			"iss": kubetest.Issuer, "sub": "system:serviceaccount:kubetest:sa", "aud": []string{"test"},
			"iat": exp.Add(-time.Hour).Unix(), "nbf": exp.Add(-time.Hour).Unix(), "exp": exp.Unix(),
			"kubernetes.io": map[string]any{"namespace": "kubetest", "serviceaccount": map[string]any{"name": "sa", "uid": string(sa.UID)}},
		}
	}
	valid, err := env.SignToken(claims(time.Now().Add(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if st := review(valid); !st.Authenticated {
		t.Fatalf("self-signed valid token refused: %+v", st)
	}
	expired, err := env.SignToken(claims(time.Now().Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	if st := review(expired); st.Authenticated {
		t.Fatalf("expired token accepted: %+v", st)
	}
}
