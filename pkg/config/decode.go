package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

// Object is one decoded Kubernetes object and where it came from. Obj is one
// of *corev1.Namespace, *corev1.Pod, *corev1.Service, *corev1.ServiceAccount,
// *discoveryv1.EndpointSlice, *gwv1.Gateway, *gwv1.GatewayClass,
// *gwv1.HTTPRoute, *gwv1.GRPCRoute, *gwv1.ReferenceGrant, *gwv1.BackendTLSPolicy,
// *corev1.ConfigMap (read for BackendTLSPolicies' CA certificates),
// *corev1.Secret (read for ingress listeners' certificates),
// *corev1.Node (read for its topology labels), *networkingv1.Ingress,
// *networkingv1.IngressClass or *ConnectionPolicy
// (v1beta1 Gateway API objects are converted to v1). The Kubernetes source
// builds the same list from its informers and translates it incrementally
// (Incremental), to the same result, so both sources share every rule.
type Object struct {
	Origin string
	Obj    runtime.Object
}

// MaxDocumentBytes bounds one YAML document.
const MaxDocumentBytes = 4 << 20

var deserializer = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, discoveryv1.AddToScheme, networkingv1.AddToScheme, gwv1.Install, gwv1beta1.Install, addCausewayKinds,
	} {
		if err := add(scheme); err != nil {
			panic(fmt.Sprintf("config: build scheme: %v", err)) // programming error, caught by any test
		}
	}
	// Strict: an unknown or duplicated field is a typo the operator wants to hear about.
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}()

// Decode splits multi-document YAML (JSON is YAML too) and decodes every
// document into its Kubernetes type. Empty documents are skipped. Any
// syntax error, unknown field, or kind this mesh does not read is an error
// naming the document; nothing is returned then.
func Decode(origin string, data []byte) ([]Object, error) {
	var ps problems
	var out []Object
	r := utilyaml.NewYAMLReader(bufio.NewReaderSize(bytes.NewReader(data), 64<<10))
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		where := fmt.Sprintf("document %d", n)
		if err != nil {
			ps.add(origin, where, "read: %v", err)
			break
		}
		if len(doc) > MaxDocumentBytes {
			ps.add(origin, where, "document is larger than %d bytes", MaxDocumentBytes)
			continue
		}
		obj, err := decodeDocument(doc)
		if err != nil {
			ps.add(origin, where, "%v", err)
			continue
		}
		if obj == nil {
			continue
		}
		out = append(out, Object{Origin: origin, Obj: obj})
	}
	if err := ps.err(); err != nil {
		return nil, err
	}
	return out, nil
}

func decodeDocument(doc []byte) (runtime.Object, error) {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, fmt.Errorf("YAML syntax: %w", err)
	}
	js = bytes.TrimSpace(js)
	if len(js) == 0 || string(js) == "null" {
		return nil, nil // only comments or whitespace
	}
	if js[0] != '{' {
		return nil, errors.New("document is not an object")
	}
	obj, gvk, err := deserializer.Decode(js, nil, nil)
	if err != nil {
		if gvk != nil && gvk.Kind != "" && runtime.IsNotRegisteredError(err) {
			return nil, fmt.Errorf("unknown kind %s (apiVersion %s)", gvk.Kind, gvk.GroupVersion())
		}
		return nil, err
	}
	switch o := obj.(type) {
	case *corev1.Namespace, *corev1.Node, *corev1.Pod, *corev1.Service, *corev1.ServiceAccount,
		*discoveryv1.EndpointSlice,
		*gwv1.Gateway, *gwv1.GatewayClass, *gwv1.HTTPRoute, *gwv1.GRPCRoute, *gwv1.ReferenceGrant,
		*gwv1.BackendTLSPolicy, *corev1.ConfigMap, *corev1.Secret, *ConnectionPolicy,
		*networkingv1.Ingress, *networkingv1.IngressClass:
		return obj, nil
	case *gwv1beta1.Gateway:
		return (*gwv1.Gateway)(o), nil
	case *gwv1beta1.GatewayClass:
		return (*gwv1.GatewayClass)(o), nil
	case *gwv1beta1.HTTPRoute:
		return (*gwv1.HTTPRoute)(o), nil
	case *gwv1beta1.ReferenceGrant:
		return (*gwv1.ReferenceGrant)(o), nil
	}
	return nil, fmt.Errorf("unknown kind %s (apiVersion %s): this mesh reads Namespace, Node, Pod, Service, ServiceAccount, ConfigMap, Secret, EndpointSlice, Gateway, GatewayClass, HTTPRoute, GRPCRoute, ReferenceGrant, BackendTLSPolicy, ConnectionPolicy, Ingress and IngressClass",
		gvk.Kind, gvk.GroupVersion())
}

// DecodeFile reads one file (at most MaxFileBytes) and decodes it.
func DecodeFile(path string) ([]Object, error) {
	data, err := readlimit.File(path, MaxFileBytes)
	if err != nil {
		return nil, err
	}
	return Decode(path, data)
}
