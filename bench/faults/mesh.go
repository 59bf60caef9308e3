package main

import "github.com/causeway-mesh/causeway/bench/internal/benchmesh"

// The harness's own addresses, apart from the sample (127.0.10.x), the
// end-to-end suite (127.0.40.x) and the benchmarks (127.0.90.x, 127.0.91.x):
// pods 127.0.83.x, their apps 127.0.183.x, service VIPs 127.0.84.x.
//
//	web/frontend (node-a) --GET http://reviews.shop/--> waypoint-0 (node-a) or waypoint-1 (node-b)
//	                                                  --> reviews-v1 (node-a) / reviews-v2 (node-b)
var meshTemplate = `
apiVersion: v1
kind: Namespace
metadata: {name: web, labels: {causeway.dev/dataplane-mode: mesh}}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {causeway.dev/dataplane-mode: mesh, causeway.dev/use-waypoint: waypoint}}
---
` + benchmesh.WaypointYAML("shop", "service",
	benchmesh.WaypointPod{Node: "node-a", IP: "127.0.83.2"}, benchmesh.WaypointPod{Node: "node-b", IP: "127.0.83.3"}) + `apiVersion: v1
kind: Pod
metadata: {name: frontend, namespace: web, labels: {app: frontend}}
spec: {nodeName: node-a, serviceAccountName: frontend, containers: [{name: frontend, image: causeway/echo}]}
status: {podIP: 127.0.83.1}
---
apiVersion: v1
kind: Pod
metadata:
  name: reviews-v1
  namespace: shop
  labels: {app: reviews, version: v1}
  annotations: {causeway.dev/local-app: echo, causeway.dev/app-address: 127.0.183.11}
spec: {nodeName: node-a, serviceAccountName: reviews, containers: [{name: reviews, image: causeway/echo, ports: [{containerPort: 8080, name: http}]}]}
status: {podIP: 127.0.83.11}
---
apiVersion: v1
kind: Pod
metadata:
  name: reviews-v2
  namespace: shop
  labels: {app: reviews, version: v2}
  annotations: {causeway.dev/local-app: echo, causeway.dev/app-address: 127.0.183.12}
spec: {nodeName: node-b, serviceAccountName: reviews, containers: [{name: reviews, image: causeway/echo, ports: [{containerPort: 8080, name: http}]}]}
status: {podIP: 127.0.83.12}
---
apiVersion: v1
kind: Namespace
metadata: {name: soak, labels: {causeway.dev/dataplane-mode: mesh}}
---
apiVersion: v1
kind: Pod
metadata:
  name: sink
  namespace: soak
  annotations:
    causeway.dev/local-app: 'exec "$CAUSEWAY_BIN/echo" --pod sink --namespace soak --idle-timeout 1h --listen $CAUSEWAY_APP_LISTEN'
    causeway.dev/app-address: 127.0.183.13
spec: {nodeName: node-b, serviceAccountName: sink, containers: [{name: sink, image: causeway/echo, ports: [{containerPort: 8080, name: http}]}]}
status: {podIP: 127.0.83.13}
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec:
  clusterIP: 127.0.84.1
  selector: {app: reviews}
  ports: [{name: http, port: 80, targetPort: 8080, appProtocol: http}]
---
apiVersion: v1
kind: Service
metadata: {name: reviews-v1, namespace: shop}
spec:
  clusterIP: 127.0.84.2
  selector: {app: reviews, version: v1}
  ports: [{name: http, port: 80, targetPort: 8080, appProtocol: http}]
---
apiVersion: v1
kind: Service
metadata: {name: reviews-v2, namespace: shop}
spec:
  clusterIP: 127.0.84.3
  selector: {app: reviews, version: v2}
  ports: [{name: http, port: 80, targetPort: 8080, appProtocol: http}]
`
