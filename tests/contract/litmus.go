package main

// Litmus ChaosEngine (litmuschaos.io/v1alpha1).
//
// The upstream Go module (github.com/litmuschaos/chaos-operator, package
// api/litmuschaos/v1alpha1) is refused by the Go module proxy this project can
// reach, so it cannot be a dependency. This file is the best check that is:
//   - the ChaosEngine spec written out as Go types with the upstream JSON
//     field names, JSON types and omitempty-ness (so strict decoding catches
//     unknown fields and wrong types, and the required-field rule of its
//     controller-gen CRD applies: chaosServiceAccount, components.runner,
//     engineState, experiments[].name/spec/spec.rank); Kubernetes parts use
//     the real k8s.io/api types (corev1.EnvVar, Toleration, ...); parts monsoon
//     never writes (probes, sidecars, selectors) are accepted unchecked;
//   - the patterns of the operator's published CRD (engineState, appkind,
//     jobCleanUpPolicy);
//   - what the operator and litmus-go would otherwise get wrong without an
//     error: an empty service account or experiment list, an unparsable
//     applabel, env names that are not valid variable names or repeat, and
//     experiment variables litmus-go reads with strconv.Atoi / ParseBool
//     ignoring the error (a bad value silently becomes 0 or false).

import (
	"encoding/json"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

type ChaosEngine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ChaosEngineSpec `json:"spec,omitempty"`
	Status json.RawMessage `json:"status,omitempty"`
}

type ChaosEngineSpec struct {
	Appinfo                       ApplicationParams `json:"appinfo,omitempty"`
	DefaultHealthCheck            json.RawMessage   `json:"defaultHealthCheck,omitempty"` // bool in Go, string in the CRD
	ChaosServiceAccount           string            `json:"chaosServiceAccount"`
	Components                    ComponentParams   `json:"components"`
	Experiments                   []ExperimentList  `json:"experiments"`
	JobCleanUpPolicy              string            `json:"jobCleanUpPolicy,omitempty"`
	AuxiliaryAppInfo              string            `json:"auxiliaryAppInfo,omitempty"`
	EngineState                   string            `json:"engineState"`
	TerminationGracePeriodSeconds int64             `json:"terminationGracePeriodSeconds,omitempty"`
	Selectors                     json.RawMessage   `json:"selectors,omitempty"`
}

type ApplicationParams struct {
	Appns    string `json:"appns,omitempty"`
	Applabel string `json:"applabel,omitempty"`
	AppKind  string `json:"appkind,omitempty"`
}

type ComponentParams struct {
	Runner  RunnerInfo      `json:"runner"`
	Sidecar json.RawMessage `json:"sidecar,omitempty"`
}

type RunnerInfo struct {
	Image            string                        `json:"image,omitempty"`
	Type             string                        `json:"type,omitempty"`
	Args             []string                      `json:"args,omitempty"`
	Command          []string                      `json:"command,omitempty"`
	ImagePullPolicy  corev1.PullPolicy             `json:"imagePullPolicy,omitempty"`
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	RunnerAnnotation map[string]string             `json:"runnerAnnotations,omitempty"`
	RunnerLabels     map[string]string             `json:"runnerLabels,omitempty"`
	NodeSelector     map[string]string             `json:"nodeSelector,omitempty"`
	ConfigMaps       json.RawMessage               `json:"configMaps,omitempty"`
	Secrets          json.RawMessage               `json:"secrets,omitempty"`
	Tolerations      []corev1.Toleration           `json:"tolerations,omitempty"`
	Resources        corev1.ResourceRequirements   `json:"resources,omitempty"`
}

type ExperimentList struct {
	Name string               `json:"name"`
	Spec ExperimentAttributes `json:"spec"`
}

type ExperimentAttributes struct {
	Rank       uint32               `json:"rank"`
	Components ExperimentComponents `json:"components,omitempty"`
	Probe      json.RawMessage      `json:"probe,omitempty"`
}

type ExperimentComponents struct {
	ENV                        []corev1.EnvVar               `json:"env,omitempty"`
	ConfigMaps                 json.RawMessage               `json:"configMaps,omitempty"`
	Secrets                    json.RawMessage               `json:"secrets,omitempty"`
	ExperimentAnnotations      map[string]string             `json:"experimentAnnotations,omitempty"`
	ExperimentImage            string                        `json:"experimentImage,omitempty"`
	ExperimentImagePullSecrets []corev1.LocalObjectReference `json:"experimentImagePullSecrets,omitempty"`
	NodeSelector               map[string]string             `json:"nodeSelector,omitempty"`
	StatusCheckTimeouts        StatusCheckTimeout            `json:"statusCheckTimeouts,omitempty"`
	Resources                  corev1.ResourceRequirements   `json:"resources,omitempty"`
	Tolerations                []corev1.Toleration           `json:"tolerations,omitempty"`
}

type StatusCheckTimeout struct {
	Delay   int `json:"delay,omitempty"`
	Timeout int `json:"timeout,omitempty"`
}

var litmusRules = func() *schemaRules {
	pkg := "main"
	s := newSchemaRules(pkg)
	pattern := func(key, re string) {
		r := &rule{}
		if err := r.set("Pattern", strconv.Quote(re)); err != nil {
			panic(err)
		}
		s.fields[pkg+"."+key] = r
	}
	// the operator's published CRD (deploy/chaos_crds.yaml)
	pattern("ChaosEngineSpec.EngineState", `^(active|stop)$`)
	pattern("ChaosEngineSpec.JobCleanUpPolicy", `^(delete|retain)$`)
	pattern("ApplicationParams.AppKind", `^(^$|deployment|statefulset|daemonset|deploymentconfig|rollout)$`)
	return s
}()

// experiment variables litmus-go parses, ignoring a parse error (the value then silently becomes 0 or false)
var (
	litmusIntEnv = map[string]bool{"TOTAL_CHAOS_DURATION": true, "CHAOS_INTERVAL": true, "RAMP_TIME": true,
		"KILL_COUNT": true, "NETWORK_LATENCY": true, "JITTER": true, "PODS_AFFECTED_PERC": true,
		"MEMORY_CONSUMPTION": true, "NUMBER_OF_WORKERS": true, "STATUS_CHECK_DELAY": true,
		"STATUS_CHECK_TIMEOUT": true}
	litmusPositiveEnv = map[string]bool{"TOTAL_CHAOS_DURATION": true, "MEMORY_CONSUMPTION": true,
		"NUMBER_OF_WORKERS": true}
	litmusBoolEnv = map[string]bool{"FORCE": true}
)

func checkLitmus(kind string, js []byte) error {
	if kind != "ChaosEngine" {
		return fmt.Errorf("litmus kind %q is not checked (only ChaosEngine)", kind)
	}
	var ce ChaosEngine
	if err := strictDecode(js, &ce); err != nil {
		return err
	}
	errs := objectMeta(&ce)
	errs = append(errs, litmusRules.validateJSON(js, &ce)...)
	if len(errs) > 0 {
		return errs.ToAggregate()
	}
	spec := field.NewPath("spec")
	if ce.Spec.ChaosServiceAccount == "" {
		errs = append(errs, field.Required(spec.Child("chaosServiceAccount"), "the chaos runner runs as this account"))
	}
	if len(ce.Spec.Experiments) == 0 {
		errs = append(errs, field.Required(spec.Child("experiments"), "an engine without experiments injects nothing"))
	}
	if l := ce.Spec.Appinfo.Applabel; l != "" {
		if _, err := labels.Parse(l); err != nil {
			errs = append(errs, field.Invalid(spec.Child("appinfo", "applabel"), l, err.Error()))
		}
	}
	if ce.Spec.Appinfo.Applabel != "" && ce.Spec.Appinfo.Appns == "" {
		errs = append(errs, field.Required(spec.Child("appinfo", "appns"), "applabel is looked up in appns"))
	}
	for i, exp := range ce.Spec.Experiments {
		ep := spec.Child("experiments").Index(i)
		if exp.Name == "" {
			errs = append(errs, field.Required(ep.Child("name"), "the ChaosExperiment to run"))
		}
		seen := map[string]bool{}
		for j, e := range exp.Spec.Components.ENV {
			p := ep.Child("spec", "components", "env").Index(j)
			for _, msg := range validation.IsEnvVarName(e.Name) {
				errs = append(errs, field.Invalid(p.Child("name"), e.Name, msg))
			}
			if seen[e.Name] {
				errs = append(errs, field.Duplicate(p.Child("name"), e.Name))
			}
			seen[e.Name] = true
			if e.ValueFrom != nil {
				if e.Value != "" {
					errs = append(errs, field.Invalid(p.Child("valueFrom"), "", "may not be specified when `value` is not empty"))
				}
				continue
			}
			vp := p.Child("value")
			if litmusIntEnv[e.Name] {
				n, err := strconv.Atoi(e.Value)
				switch {
				case err != nil:
					errs = append(errs, field.Invalid(vp, e.Value, e.Name+" must be an integer (litmus-go reads it with strconv.Atoi and would use 0)"))
				case n < 0 || (n == 0 && litmusPositiveEnv[e.Name]):
					errs = append(errs, field.Invalid(vp, e.Value, e.Name+" must be positive"))
				}
			}
			if litmusBoolEnv[e.Name] {
				if _, err := strconv.ParseBool(e.Value); err != nil {
					errs = append(errs, field.Invalid(vp, e.Value, e.Name+" must be true or false (litmus-go would use false)"))
				}
			}
		}
	}
	return errs.ToAggregate()
}
