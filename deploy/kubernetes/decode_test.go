package kubernetes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// object is one document of a manifest, decoded into its API type.
type object struct {
	index int    // position in the file, from 0
	kind  string // apiVersion/kind
	name  string
	value any // *appsv1.DaemonSet, *corev1.Service, … or *cnpgCluster
}

// kinds are the API types a rendered manifest may hold; any other kind
// is an error, so that a new template is checked before it ships.
var kinds = map[string]func() any{
	"v1/ServiceAccount":             func() any { return new(corev1.ServiceAccount) },
	"v1/Secret":                     func() any { return new(corev1.Secret) },
	"v1/Service":                    func() any { return new(corev1.Service) },
	"apps/v1/DaemonSet":             func() any { return new(appsv1.DaemonSet) },
	"postgresql.cnpg.io/v1/Cluster": func() any { return new(cnpgCluster) },
}

// cnpgCluster is the part of CloudNativePG's Cluster (not in k8s.io/api)
// the chart renders; decoding strictly into it fails on any other field,
// so a field the chart starts to render is added here, checked against the
// operator's documentation, first.
type cnpgCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Instances int    `json:"instances"`
		ImageName string `json:"imageName,omitempty"`
		Bootstrap struct {
			InitDB struct {
				Database string `json:"database"`
				Owner    string `json:"owner"`
			} `json:"initdb"`
		} `json:"bootstrap"`
		Storage struct {
			Size         string `json:"size"`
			StorageClass string `json:"storageClass,omitempty"`
		} `json:"storage"`
		PostgreSQL *struct {
			Parameters map[string]string `json:"parameters"`
		} `json:"postgresql,omitempty"`
		Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	} `json:"spec"`
}

// decodeManifest splits a multi-document YAML file and decodes every
// non-empty document strictly (see decodeStrict) into the type its
// apiVersion and kind name.
func decodeManifest(data []byte) ([]object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue // only comments, or nothing
		}
		var tm metav1.TypeMeta
		if err := kjson.UnmarshalCaseSensitivePreserveInts(js, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		kind := tm.APIVersion + "/" + tm.Kind
		newValue, ok := kinds[kind]
		if !ok {
			return nil, fmt.Errorf("document %d: unexpected kind %q", i, kind)
		}
		v := newValue()
		if err := decodeStrict(js, v); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, kind, err)
		}
		objs = append(objs, object{index: i, kind: kind, name: v.(metav1.Object).GetName(), value: v})
	}
}

// decodeStrict decodes JSON as the API server does when asked for strict
// field validation: keys match case-sensitively, and an unknown or
// duplicate field is an error.
func decodeStrict(js []byte, v any) error {
	strict, err := kjson.UnmarshalStrict(js, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// only returns the one object of type T in objs, or an error when there is
// none or more than one.
func only[T any](objs []object) (T, error) {
	var found []T
	for _, o := range objs {
		if v, ok := o.value.(T); ok {
			found = append(found, v)
		}
	}
	var zero T
	if len(found) != 1 {
		return zero, fmt.Errorf("%d objects of type %T, want 1", len(found), zero)
	}
	return found[0], nil
}

// find returns the object of type T named name, if there is one.
func find[T any](objs []object, name string) (T, bool) {
	for _, o := range objs {
		if v, ok := o.value.(T); ok && o.name == name {
			return v, true
		}
	}
	var zero T
	return zero, false
}
