package agent

import "testing"

func TestEnrolled(t *testing.T) {
	mesh := map[string]string{LabelDataplaneMode: ModeMesh}
	for _, tc := range []struct {
		name     string
		pod, ns  map[string]string
		enrolled bool
	}{
		{"pod label", mesh, nil, true},
		{"namespace label", nil, mesh, true},
		{"neither", nil, nil, false},
		{"pod opts out of an enrolled namespace", map[string]string{LabelDataplaneMode: ModeNone}, mesh, false},
		{"other pod value defers to the namespace", map[string]string{LabelDataplaneMode: "sidecar"}, mesh, true},
		{"waypoint in an enrolled namespace", map[string]string{LabelGatewayName: "wp"}, mesh, false},
		{"waypoint with the pod label", map[string]string{LabelGatewayName: "wp", LabelDataplaneMode: ModeMesh}, nil, false},
	} {
		got, why := Enrolled(Pod{Namespace: "t", Labels: tc.pod, NamespaceLabels: tc.ns})
		if got != tc.enrolled {
			t.Errorf("%s: Enrolled = %v (%s), want %v", tc.name, got, why, tc.enrolled)
		}
		if !got && why == "" {
			t.Errorf("%s: no reason given", tc.name)
		}
	}
}
