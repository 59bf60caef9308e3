package policybundle

import (
	"strings"
	"testing"
	"time"
)

// New refuses a feed without a service or resource and fills in the
// defaults; the feed is named after its bundle. (Downloading is tested
// through the engine: pkg/policy's TestBundleSource.)
func TestNewChecksOptions(t *testing.T) {
	service := []byte(`{"url": "https://opa.example"}`)
	for name, o := range map[string]Options{
		"no service":  {Resource: "bundles/b.tar.gz"},
		"no resource": {Service: service},
	} {
		if _, err := New(o); err == nil || !strings.Contains(err.Error(), "service and resource are required") {
			t.Errorf("%s: %v", name, err)
		}
	}
	f, err := New(Options{Service: service, Resource: "bundles/b.tar.gz"})
	if err != nil {
		t.Fatal(err)
	}
	if f.Name() != "bundle:policy" || f.Options().MaxBytes != 64<<20 {
		t.Fatalf("defaults: name %q, max bytes %d", f.Name(), f.Options().MaxBytes)
	}
	// Sub-second or inverted delays become a valid interval.
	if f, err = New(Options{Service: service, Resource: "r", MinDelay: 5 * time.Second, MaxDelay: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if min, max := *f.cfg.Polling.MinDelaySeconds, *f.cfg.Polling.MaxDelaySeconds; min != 5 || max != 5 {
		t.Fatalf("polling %d-%d s, want 5-5", min, max)
	}
}
