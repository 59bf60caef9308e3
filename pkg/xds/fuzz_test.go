package xds

import (
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// FuzzDecodeDelta feeds a delta response as it arrives on the wire through
// the client's decoding: every resource it accepts must be valid, named as
// the response names it, and survive a marshal round trip unchanged.
func FuzzDecodeDelta(f *testing.F) {
	ident := "spiffe://cluster.local/ns/ns/sa/sa"
	seeds := []proto.Message{
		&meshv1.Workload{Uid: "u", Name: "p", Namespace: "ns", Identity: ident, Addresses: []string{"127.0.10.1"}, ServingPorts: []uint32{8080}},
		&meshv1.Service{Name: "s", Namespace: "ns", Vips: []string{"10.96.0.1"}, Endpoints: []*meshv1.Endpoint{{Address: "127.0.10.1", Ports: map[uint32]uint32{80: 8080}}}},
		&meshv1.Waypoint{Name: "w", Namespace: "ns", Identity: ident, HbonePort: 15008, WaypointFor: "service"},
		&meshv1.HTTPRoute{Name: "r", Namespace: "ns", Rules: []*meshv1.HTTPRouteRule{{Matches: []*meshv1.HTTPRouteMatch{{Path: &meshv1.PathMatch{Type: meshv1.PathMatch_REGULAR_EXPRESSION, Value: "/a.*"}}}}}},
		&meshv1.GRPCRoute{Name: "g", Namespace: "ns", Rules: []*meshv1.GRPCRouteRule{{Matches: []*meshv1.GRPCRouteMatch{{Method: &meshv1.GRPCMethodMatch{Service: "pkg.Svc", Method: "Get"}}}}}},
	}
	for i, m := range seeds {
		body, err := anypb.New(m)
		if err != nil {
			f.Fatal(err)
		}
		resp := &discovery.DeltaDiscoveryResponse{
			TypeUrl:          meshv1.TypeURLs[i],
			Nonce:            "1",
			Resources:        []*discovery.Resource{{Name: meshv1.ResourceName(m), Version: "v1", Resource: body}},
			RemovedResources: []string{"gone"},
		}
		wire, err := proto.Marshal(resp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(wire)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		var resp discovery.DeltaDiscoveryResponse
		if err := proto.Unmarshal(wire, &resp); err != nil {
			return
		}
		for _, r := range resp.GetResources() {
			m, err := decodeResource(resp.GetTypeUrl(), r)
			if err != nil {
				if err.Error() == "" {
					t.Fatal("refusal without a reason")
				}
				continue
			}
			if err := meshv1.Validate(m); err != nil {
				t.Fatalf("accepted an invalid resource %q: %v", r.GetName(), err)
			}
			if meshv1.ResourceName(m) != r.GetName() {
				t.Fatalf("accepted %q under the name %q", meshv1.ResourceName(m), r.GetName())
			}
			value, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
			if err != nil {
				t.Fatalf("accepted resource %q does not marshal: %v", r.GetName(), err)
			}
			again, err := decodeResource(resp.GetTypeUrl(), &discovery.Resource{Name: r.GetName(),
				Resource: &anypb.Any{TypeUrl: resp.GetTypeUrl(), Value: value}})
			if err != nil || !proto.Equal(again, m) {
				t.Fatalf("resource %q does not survive a round trip: %v", r.GetName(), err)
			}
		}
	})
}
