package main

// Built-in Kubernetes objects monsoon renders beside its chaos objects: the load's Indexed Job
// (batch/v1), its ConfigMap (v1) and the scheduled runs' CronJob (batch/v1). Strict decoding into the upstream k8s.io/api types and the
// API server's metadata validation, plus the rules of the API server's Job validation
// (k8s.io/kubernetes pkg/apis/batch/validation, which is not importable as a module) that a
// rendered Job could break: restart policy, Indexed completions, selector-free labels,
// container names and images, mounts of declared volumes; for a CronJob, the rules of
// ValidateCronJobSpec: a standard cron schedule (robfig/cron, the parser the API server uses), a known
// concurrency policy, non-negative deadline and history limits, a name of at most 52 characters.

import (
	"fmt"
	"strings"

	"github.com/robfig/cron/v3"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

const maxIndexedCompletions = 100000 // the API server's limit for completionMode: Indexed

func checkCore(apiVersion, kind string, js []byte) error {
	switch {
	case apiVersion == "v1" && kind == "ConfigMap":
		var cm corev1.ConfigMap
		if err := strictDecode(js, &cm); err != nil {
			return err
		}
		errs := objectMeta(&cm)
		for k := range cm.Data {
			for _, msg := range validation.IsConfigMapKey(k) {
				errs = append(errs, field.Invalid(field.NewPath("data").Key(k), k, msg))
			}
		}
		return errs.ToAggregate()
	case apiVersion == "batch/v1" && kind == "Job":
		var job batchv1.Job
		if err := strictDecode(js, &job); err != nil {
			return err
		}
		errs := objectMeta(&job)
		errs = append(errs, jobSpec(&job.Spec, field.NewPath("spec"))...)
		return errs.ToAggregate()
	case apiVersion == "batch/v1" && kind == "CronJob":
		var cj batchv1.CronJob
		if err := strictDecode(js, &cj); err != nil {
			return err
		}
		errs := objectMeta(&cj)
		errs = append(errs, cronJobSpec(&cj, field.NewPath("spec"))...)
		return errs.ToAggregate()
	}
	return fmt.Errorf("%s %s is not a kind this checker knows", apiVersion, kind)
}

const maxCronJobNameLength = 52 // the API server's limit: the Jobs it creates append an 11-character suffix

func cronJobSpec(cj *batchv1.CronJob, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(cj.Name) > maxCronJobNameLength {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), cj.Name,
			fmt.Sprintf("must be no more than %d characters", maxCronJobNameLength)))
	}
	s := &cj.Spec
	if s.Schedule == "" {
		errs = append(errs, field.Required(p.Child("schedule"), ""))
	} else if strings.Contains(s.Schedule, "TZ") {
		errs = append(errs, field.Invalid(p.Child("schedule"), s.Schedule, "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"))
	} else if _, err := cron.ParseStandard(s.Schedule); err != nil {
		errs = append(errs, field.Invalid(p.Child("schedule"), s.Schedule, err.Error()))
	}
	switch s.ConcurrencyPolicy {
	case batchv1.AllowConcurrent, batchv1.ForbidConcurrent, batchv1.ReplaceConcurrent:
	default:
		errs = append(errs, field.NotSupported(p.Child("concurrencyPolicy"), s.ConcurrencyPolicy,
			[]string{string(batchv1.AllowConcurrent), string(batchv1.ForbidConcurrent), string(batchv1.ReplaceConcurrent)}))
	}
	for name, v := range map[string]*int32{"successfulJobsHistoryLimit": s.SuccessfulJobsHistoryLimit,
		"failedJobsHistoryLimit": s.FailedJobsHistoryLimit} {
		if v != nil && *v < 0 {
			errs = append(errs, field.Invalid(p.Child(name), *v, "must be greater than or equal to 0"))
		}
	}
	if s.StartingDeadlineSeconds != nil && *s.StartingDeadlineSeconds < 0 {
		errs = append(errs, field.Invalid(p.Child("startingDeadlineSeconds"), *s.StartingDeadlineSeconds,
			"must be greater than or equal to 0"))
	}
	return append(errs, jobSpec(&s.JobTemplate.Spec, p.Child("jobTemplate", "spec"))...)
}

func jobSpec(s *batchv1.JobSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for name, v := range map[string]*int32{"parallelism": s.Parallelism, "completions": s.Completions,
		"backoffLimit": s.BackoffLimit} {
		if v != nil && *v < 0 {
			errs = append(errs, field.Invalid(p.Child(name), *v, "must be greater than or equal to 0"))
		}
	}
	if s.CompletionMode != nil {
		switch *s.CompletionMode {
		case batchv1.IndexedCompletion:
			if s.Completions == nil {
				errs = append(errs, field.Required(p.Child("completions"),
					"when completionMode is Indexed"))
			} else if *s.Completions > maxIndexedCompletions {
				errs = append(errs, field.Invalid(p.Child("completions"), *s.Completions,
					fmt.Sprintf("must be less than or equal to %d when completionMode is Indexed", maxIndexedCompletions)))
			}
		case batchv1.NonIndexedCompletion:
		default:
			errs = append(errs, field.NotSupported(p.Child("completionMode"), *s.CompletionMode,
				[]string{string(batchv1.NonIndexedCompletion), string(batchv1.IndexedCompletion)}))
		}
	}
	if s.Selector != nil && (s.ManualSelector == nil || !*s.ManualSelector) {
		errs = append(errs, field.Invalid(p.Child("selector"), s.Selector,
			"`selector` will be auto-generated"))
	}
	t := p.Child("template")
	for k, v := range s.Template.Labels {
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(t.Child("metadata", "labels").Key(k), k, msg))
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			errs = append(errs, field.Invalid(t.Child("metadata", "labels").Key(k), v, msg))
		}
	}
	ps := &s.Template.Spec
	sp := t.Child("spec")
	switch ps.RestartPolicy {
	case corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure:
	default:
		errs = append(errs, field.NotSupported(sp.Child("restartPolicy"), ps.RestartPolicy,
			[]string{string(corev1.RestartPolicyOnFailure), string(corev1.RestartPolicyNever)}))
	}
	if len(ps.Containers) == 0 {
		errs = append(errs, field.Required(sp.Child("containers"), ""))
	}
	volumes := map[string]bool{}
	for i, v := range ps.Volumes {
		vp := sp.Child("volumes").Index(i)
		for _, msg := range validation.IsDNS1123Label(v.Name) {
			errs = append(errs, field.Invalid(vp.Child("name"), v.Name, msg))
		}
		if volumes[v.Name] {
			errs = append(errs, field.Duplicate(vp.Child("name"), v.Name))
		}
		volumes[v.Name] = true
		if v.ConfigMap != nil && v.ConfigMap.Name == "" {
			errs = append(errs, field.Required(vp.Child("configMap", "name"), ""))
		}
	}
	names := map[string]bool{}
	for i, c := range ps.Containers {
		cp := sp.Child("containers").Index(i)
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			errs = append(errs, field.Invalid(cp.Child("name"), c.Name, msg))
		}
		if names[c.Name] {
			errs = append(errs, field.Duplicate(cp.Child("name"), c.Name))
		}
		names[c.Name] = true
		if c.Image == "" {
			errs = append(errs, field.Required(cp.Child("image"), ""))
		}
		for j, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				errs = append(errs, field.NotFound(cp.Child("volumeMounts").Index(j).Child("name"), m.Name))
			}
			if m.MountPath == "" {
				errs = append(errs, field.Required(cp.Child("volumeMounts").Index(j).Child("mountPath"), ""))
			}
		}
		for res, q := range c.Resources.Requests {
			if l, ok := c.Resources.Limits[res]; ok && q.Cmp(l) > 0 {
				errs = append(errs, field.Invalid(cp.Child("resources", "requests").Key(string(res)), q.String(),
					"must be less than or equal to "+string(res)+" limit of "+l.String()))
			}
		}
	}
	return errs
}
