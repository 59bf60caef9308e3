package config

import (
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// What telemetry calls a pod (Istio's standard labels): the workload it
// belongs to and its canonical service and revision. Istio derives them
// the same way, so dashboards show the same names under either mesh.

// cronJobName matches a Job a CronJob created: its name, a dash, and the
// scheduled time in minutes (8 to 10 digits).
var cronJobName = regexp.MustCompile(`^(.+)-\d{8,10}$`)

// workloadName is the name of the pod's controller and its type, as
// Istio types workloads: a Deployment's ("deployment", its ReplicaSet's
// name less the pod-template-hash), a CronJob's ("cronjob", its Job's name
// less the schedule suffix), a Job's ("job"), any other controller's own
// name, or the pod's when it has no controller (both "pod": the types
// Istio's node proxies read are these four).
func workloadName(pod *corev1.Pod) (name, typ string) {
	for _, ref := range pod.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller {
			continue
		}
		switch ref.Kind {
		case "ReplicaSet":
			if h := pod.Labels["pod-template-hash"]; h != "" {
				if name, ok := strings.CutSuffix(ref.Name, "-"+h); ok && name != "" {
					return name, "deployment"
				}
			}
		case "Job":
			if m := cronJobName.FindStringSubmatch(ref.Name); m != nil {
				return m[1], "cronjob"
			}
			return ref.Name, "job"
		}
		return ref.Name, "pod"
	}
	return pod.Name, "pod"
}

// firstLabel is the value of the first of keys that labels has non-empty,
// else def.
func firstLabel(labels map[string]string, def string, keys ...string) string {
	for _, k := range keys {
		if v := labels[k]; v != "" {
			return v
		}
	}
	return def
}

// nameWorkload sets w's telemetry names from pod.
func nameWorkload(w *meshv1.Workload, pod *corev1.Pod) {
	l := pod.Labels
	w.WorkloadName, w.WorkloadType = workloadName(pod)
	w.CanonicalService = firstLabel(l, w.WorkloadName, "service.istio.io/canonical-name", "app.kubernetes.io/name", "app")
	w.CanonicalRevision = firstLabel(l, "latest", "service.istio.io/canonical-revision", "app.kubernetes.io/version", "version")
	w.App = firstLabel(l, "", "app", "app.kubernetes.io/name")
	w.Version = firstLabel(l, "", "version", "app.kubernetes.io/version")
}
