// Command manifest-contract checks Chaos Mesh and Litmus manifests against the
// upstream API types, the way a cluster would take them.
//
//	manifest-contract [-api-src DIR] [FILE|-]...
//
// It reads YAML (files, or stdin when no file or "-" is given; several
// documents per file) and, for each object, prints one line
//
//	<kind>/<name>: ok
//	<kind>/<name>: error: <what is wrong, with its JSON path>
//
// and exits 1 when any object fails, 2 when it cannot run at all.
//
// Chaos Mesh (chaos-mesh.org/v1alpha1, every kind the pinned api module
// registers), in the order the API server applies them:
//  1. strict decoding into the upstream Go type: unknown fields, duplicate
//     keys, case-mismatched keys and wrong JSON types are errors
//     (sigs.k8s.io/json, what `kubectl --validate=strict` uses);
//  2. object metadata as the API server validates it for custom resources
//     (DNS-subdomain name, namespace, label keys and values);
//  3. the CRD schema: the +kubebuilder:validation markers (Enum, Minimum,
//     Maximum, Pattern, ...) and required fields, read from the pinned api
//     module's own source, from which its CRDs are generated (schema.go);
//  4. Chaos Mesh's admission webhooks, called in-process: the mutating one
//     (Default) and then the validating one (ValidateCreate).
//
// The load's Indexed Job (batch/v1) and its ConfigMap (v1): core.go.
//
// Litmus (litmuschaos.io/v1alpha1 ChaosEngine): its Go module is not served by
// the module proxy here, so steps 1-3 run against a transcription of the
// ChaosEngine schema (litmus.go), plus the checks litmus-go would otherwise
// get wrong silently (integer/boolean experiment variables).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	chaosmesh "github.com/chaos-mesh/chaos-mesh/api/v1alpha1"
)

const (
	chaosMeshGV = "chaos-mesh.org/v1alpha1"
	litmusGV    = "litmuschaos.io/v1alpha1"
)

type checker struct {
	scheme *runtime.Scheme
	apiSrc string
	cm     *schemaRules // lazily loaded from the chaos-mesh api source
}

func main() {
	apiSrc := flag.String("api-src", "", "directory of the chaos-mesh api module's v1alpha1 package source "+
		"(default: found in the Go module cache from the build's own module list)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [-api-src DIR] [FILE|-]...\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	// the webhooks log through controller-runtime; keep its "SetLogger was never called" warning away
	ctrllog.SetLogger(logr.Discard())

	scheme := runtime.NewScheme()
	if err := chaosmesh.AddToScheme(scheme); err != nil {
		fatal(err)
	}
	c := &checker{scheme: scheme, apiSrc: *apiSrc}

	inputs := flag.Args()
	if len(inputs) == 0 {
		inputs = []string{"-"}
	}
	failed, checked := 0, 0
	for _, in := range inputs {
		docs, err := readDocs(in)
		if err != nil {
			fmt.Printf("%s: error: %v\n", in, err)
			failed++
			continue
		}
		for i, doc := range docs {
			id, warnings, err := c.check(doc)
			if id == "" {
				id = fmt.Sprintf("%s#%d", in, i+1)
			}
			checked++
			if err != nil {
				var fatalErr *setupError
				if errors.As(err, &fatalErr) {
					fatal(err)
				}
				fmt.Printf("%s: error: %s\n", id, oneLine(err.Error()))
				failed++
			} else if len(warnings) > 0 {
				fmt.Printf("%s: ok (warnings: %s)\n", id, oneLine(strings.Join(warnings, "; ")))
			} else {
				fmt.Printf("%s: ok\n", id)
			}
		}
	}
	if checked == 0 && failed == 0 {
		fmt.Fprintln(os.Stderr, "manifest-contract: no objects in the input")
		os.Exit(2)
	}
	if failed > 0 {
		os.Exit(1)
	}
}

// setupError means the checker itself cannot work (not the manifest's fault): exit 2.
type setupError struct{ err error }

func (e *setupError) Error() string { return e.err.Error() }
func (e *setupError) Unwrap() error { return e.err }

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "manifest-contract: %v\n", err)
	os.Exit(2)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// readDocs splits a multi-document YAML stream; empty documents (only comments, or "---" twice) are dropped.
func readDocs(path string) ([][]byte, error) {
	var r io.Reader
	if path == "-" {
		r = os.Stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	yr := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var docs [][]byte
	for {
		doc, err := yr.Read()
		if err == io.EOF {
			return docs, nil
		}
		if err != nil {
			return docs, err
		}
		if j, err := yaml.YAMLToJSON(doc); err == nil && (bytes.Equal(bytes.TrimSpace(j), []byte("null"))) {
			continue
		}
		docs = append(docs, doc)
	}
}

// check validates one YAML document; id is "<kind>/<name>" as far as the document tells them.
func (c *checker) check(doc []byte) (id string, warnings []string, err error) {
	js, err := yaml.YAMLToJSONStrict(doc) // duplicate keys are an error
	if err != nil {
		return "", nil, fmt.Errorf("not valid YAML: %w", err)
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	_ = kjson.UnmarshalCaseSensitivePreserveInts(js, &head)
	if head.Kind != "" {
		id = head.Kind + "/" + head.Metadata.Name
	}
	if head.APIVersion == "" || head.Kind == "" {
		return id, nil, errors.New("apiVersion and kind are required")
	}
	switch head.APIVersion {
	case chaosMeshGV:
		warnings, err = c.checkChaosMesh(head.Kind, js)
		return id, warnings, err
	case litmusGV:
		return id, nil, checkLitmus(head.Kind, js)
	case "v1", "batch/v1":
		return id, nil, checkCore(head.APIVersion, head.Kind, js)
	default:
		return id, nil, fmt.Errorf("apiVersion %q is none of %s, %s, v1, batch/v1", head.APIVersion, chaosMeshGV, litmusGV)
	}
}

// strictDecode decodes JSON into a typed object as the API server's strict field validation does.
func strictDecode(js []byte, obj any) error {
	strictErrs, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowUnknownFields)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, e := range strictErrs {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("strict decode: %s", strings.Join(msgs, "; "))
	}
	return nil
}

// objectMeta validates metadata the way the API server does for a namespaced custom resource.
func objectMeta(obj any) field.ErrorList {
	acc, err := meta.Accessor(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(field.NewPath("metadata"), err)}
	}
	return metavalidation.ValidateObjectMetaAccessor(acc, true, metavalidation.NameIsDNSSubdomain,
		field.NewPath("metadata"))
}

func (c *checker) checkChaosMesh(kind string, js []byte) ([]string, error) {
	gvk := chaosmesh.SchemeGroupVersion.WithKind(kind)
	obj, err := c.scheme.New(gvk)
	if err != nil {
		return nil, fmt.Errorf("chaos-mesh api has no kind %q", kind)
	}
	// 1. strict decode
	if err := strictDecode(js, obj); err != nil {
		return nil, err
	}
	// 2. metadata
	errs := objectMeta(obj)
	// 3. CRD schema (markers) on what was written, before any defaulting
	if c.cm == nil {
		rules, err := loadChaosMeshRules(c.apiSrc)
		if err != nil {
			return nil, &setupError{err}
		}
		c.cm = rules
	}
	errs = append(errs, c.cm.validateJSON(js, obj)...)
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	// 4. admission webhooks: mutating, then validating
	ctx := context.Background()
	if d, ok := obj.(webhook.CustomDefaulter); ok {
		if err := d.Default(ctx, obj); err != nil {
			return nil, fmt.Errorf("webhook Default: %w", err)
		}
	}
	v, ok := obj.(webhook.CustomValidator)
	if !ok {
		return nil, fmt.Errorf("%s has no validating webhook in the chaos-mesh api module", kind)
	}
	warnings, err := v.ValidateCreate(ctx, obj)
	if err != nil {
		return nil, fmt.Errorf("webhook ValidateCreate: %w", err)
	}
	return warnings, nil
}
