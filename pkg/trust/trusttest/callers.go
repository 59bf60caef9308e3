package trusttest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
)

// Bearer is an incoming gRPC call's context carrying
// "authorization: Bearer <token>", as an authenticator sees it.
func Bearer(token string) context.Context {
	return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
}

// WantError fails t unless err wraps kind (nil: any error) and its message
// contains substr.
func WantError(t testing.TB, err error, kind error, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v containing %q", kind, substr)
	}
	if kind != nil && !errors.Is(err, kind) {
		t.Fatalf("error %q is not %v", err, kind)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Fatalf("error %q does not contain %q", err, substr)
	}
}
