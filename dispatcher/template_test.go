package main

import (
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type reloads map[string]int

func (r reloads) TemplateReload(result string) { r[result]++ }

// An edited PodTemplate takes effect; one that is not a valid runner
// template is refused, counted, and the last good one stays; a version
// already seen is not taken again.
func TestTemplateStoreKeepsTheLastGood(t *testing.T) {
	t.Parallel()
	rec := reloads{}
	s := &templateStore{namespace: "runwarden", name: "rw-runner", log: logr.Discard(), rec: rec}
	pt := func(version, image string, restart corev1.RestartPolicy) *corev1.PodTemplate {
		return &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{ResourceVersion: version}, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: restart, Containers: []corev1.Container{{Name: "main", Image: image}},
		}}}
	}
	// The API server defaults restartPolicy to Always in a PodTemplate.
	s.update(pt("1", "runner:1", corev1.RestartPolicyAlways))
	broken := pt("2", "runner:2", "")
	broken.Template.Spec.Containers[0].Name = "not-main"
	s.update(broken)
	if got := s.Current().Spec.Containers[0].Image; got != "runner:1" {
		t.Fatalf("after a broken edit the template in force has %q, want the last good runner:1", got)
	}
	s.update(pt("3", "runner:3", ""))
	s.update(pt("3", "runner:ignored", ""))
	if got := s.Current().Spec.Containers[0].Image; got != "runner:3" {
		t.Fatalf("template in force has %q, want runner:3", got)
	}
	if rec["success"] != 2 || rec["failure"] != 1 {
		t.Errorf("reloads %v, want 2 successes and 1 failure", rec)
	}
}

func TestParseObjectRef(t *testing.T) {
	t.Parallel()
	if ns, name, err := parseObjectRef("runwarden/rw-runner"); err != nil || ns != "runwarden" || name != "rw-runner" {
		t.Errorf("parseObjectRef: %q %q %v", ns, name, err)
	}
	for _, bad := range []string{"rw-runner", "/x", "x/", "a/b/c"} {
		if _, _, err := parseObjectRef(bad); err == nil {
			t.Errorf("parseObjectRef(%q) took it", bad)
		}
	}
}
