package config

import "testing"

// What telemetry calls a pod, from its controller and labels, as Istio
// names it: a Deployment's pods by the Deployment (through the ReplicaSet
// and pod-template-hash), a CronJob's by the CronJob, others by their
// controller or themselves; canonical names from the Istio, then the
// Kubernetes recommended, then the plain labels.
func TestWorkloadTelemetryNames(t *testing.T) {
	s := mustTranslate(t, `
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {causeway.dev/dataplane-mode: mesh}}
---
apiVersion: v1
kind: Pod
metadata:
  name: reviews-v2-7d4f9c-abcde
  namespace: shop
  labels: {app: reviews, version: v2, pod-template-hash: 7d4f9c}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: reviews-v2-7d4f9c, uid: "1", controller: true}]
spec: {containers: [{name: c, image: c}]}
status: {podIP: 127.0.10.1}
---
apiVersion: v1
kind: Pod
metadata:
  name: nightly-29012345-xyz
  namespace: shop
  labels:
    service.istio.io/canonical-name: batch
    service.istio.io/canonical-revision: r7
    app.kubernetes.io/name: nightly-app
    app: ignored
  ownerReferences:
  - {apiVersion: v1, kind: ConfigMap, name: not-the-controller, uid: "2"}
  - {apiVersion: batch/v1, kind: Job, name: nightly-29012345, uid: "3", controller: true}
spec: {containers: [{name: c, image: c}]}
status: {podIP: 127.0.10.2}
---
apiVersion: v1
kind: Pod
metadata:
  name: db-0
  namespace: shop
  labels: {app.kubernetes.io/version: "15"}
  ownerReferences: [{apiVersion: apps/v1, kind: StatefulSet, name: db, uid: "4", controller: true}]
spec: {containers: [{name: c, image: c}]}
status: {podIP: 127.0.10.3}
---
apiVersion: v1
kind: Pod
metadata:
  name: lone
  namespace: shop
  labels: {pod-template-hash: zzz}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: handmade, uid: "5", controller: true}]
spec: {containers: [{name: c, image: c}]}
status: {podIP: 127.0.10.4}
---
apiVersion: v1
kind: Pod
metadata: {name: bare, namespace: shop}
spec: {containers: [{name: c, image: c}]}
status: {podIP: 127.0.10.5}
---
apiVersion: v1
kind: Pod
metadata:
  name: once-x
  namespace: shop
  ownerReferences: [{apiVersion: batch/v1, kind: Job, name: once, uid: "6", controller: true}]
spec: {containers: [{name: c, image: c}]}
status: {podIP: 127.0.10.6}
`)
	for uid, want := range map[string][6]string{ // workload, its type, canonical service, canonical revision, app, version
		"shop/reviews-v2-7d4f9c-abcde": {"reviews-v2", "deployment", "reviews", "v2", "reviews", "v2"},
		"shop/nightly-29012345-xyz":    {"nightly", "cronjob", "batch", "r7", "ignored", ""},
		"shop/db-0":                    {"db", "pod", "db", "15", "", "15"},
		"shop/lone":                    {"handmade", "pod", "handmade", "latest", "", ""},
		"shop/bare":                    {"bare", "pod", "bare", "latest", "", ""},
		"shop/once-x":                  {"once", "job", "once", "latest", "", ""},
	} {
		w := s.Workloads[uid]
		if w == nil {
			t.Errorf("%s: no workload", uid)
			continue
		}
		got := [6]string{w.GetWorkloadName(), w.GetWorkloadType(), w.GetCanonicalService(), w.GetCanonicalRevision(), w.GetApp(), w.GetVersion()}
		if got != want {
			t.Errorf("%s: workload, type, canonical service and revision, app, version = %q, want %q", uid, got, want)
		}
	}
}
