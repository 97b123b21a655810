package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// templateRecorder counts template reloads by result.
type templateRecorder interface {
	TemplateReload(result string)
}

// templateStore holds the platform's runner pod template from a PodTemplate
// object, watched: an edit takes effect for the next task, and an edit that
// is not a valid runner template is refused, logged and counted, the last
// good template staying in force.
type templateStore struct {
	namespace, name string
	client          kubernetes.Interface
	current         atomic.Pointer[corev1.PodTemplateSpec]
	log             logr.Logger
	rec             templateRecorder
	// version is the resourceVersion last looked at.
	version atomic.Pointer[string]
}

// parseObjectRef splits "NAMESPACE/NAME".
func parseObjectRef(ref string) (string, string, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q: want NAMESPACE/NAME", ref)
	}
	return ns, name, nil
}

// Current is the template in force.
func (s *templateStore) Current() corev1.PodTemplateSpec {
	return *s.current.Load()
}

// load reads the PodTemplate once; it must exist and be valid.
func (s *templateStore) load(ctx context.Context, cs kubernetes.Interface) error {
	pt, err := cs.CoreV1().PodTemplates(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the pod template %s/%s: %w", s.namespace, s.name, err)
	}
	runnerTemplate(pt)
	if err := job.ValidateTemplate(pt.Template); err != nil {
		return fmt.Errorf("pod template %s/%s: %w", s.namespace, s.name, err)
	}
	s.current.Store(&pt.Template)
	v := pt.ResourceVersion
	s.version.Store(&v)
	return nil
}

// watch follows the PodTemplate until ctx ends.
func (s *templateStore) watch(ctx context.Context, cs kubernetes.Interface) {
	lw := toolscache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "podtemplates", s.namespace, fields.OneTermEqualSelector("metadata.name", s.name))
	inf := toolscache.NewSharedInformer(lw, &corev1.PodTemplate{}, 0)
	handle := func(obj any) {
		if pt, ok := obj.(*corev1.PodTemplate); ok {
			s.update(pt)
		}
	}
	_, _ = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
		DeleteFunc: func(any) {
			s.log.Error(nil, "the pod template was deleted; the last good one stays in force until it is back", "podTemplate", s.namespace+"/"+s.name)
			s.rec.TemplateReload("failure")
		},
	})
	inf.Run(ctx.Done())
}

// update takes a new version of the PodTemplate, if it is valid.
func (s *templateStore) update(pt *corev1.PodTemplate) {
	if v := s.version.Load(); v != nil && *v == pt.ResourceVersion {
		return
	}
	v := pt.ResourceVersion
	s.version.Store(&v)
	pt = pt.DeepCopy()
	runnerTemplate(pt)
	if err := job.ValidateTemplate(pt.Template); err != nil {
		s.log.Error(err, "the pod template was changed into one that is not a valid runner template; the last good one stays in force", "podTemplate", s.namespace+"/"+s.name, "resourceVersion", v)
		s.rec.TemplateReload("failure")
		return
	}
	t := pt.Template
	s.current.Store(&t)
	s.log.Info("pod template updated; the next task's Job uses it", "podTemplate", s.namespace+"/"+s.name, "resourceVersion", v)
	s.rec.TemplateReload("success")
}

// runnerTemplate makes pt's template the runner template it holds
// (job.TemplateOf).
func runnerTemplate(pt *corev1.PodTemplate) {
	pt.Template = job.TemplateOf(pt)
}

func readTemplate(path string) (corev1.PodTemplateSpec, error) {
	var t corev1.PodTemplateSpec
	if path == "" {
		return t, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return t, fmt.Errorf("reading the pod template: %w", err)
	}
	if err := yaml.UnmarshalStrict(b, &t); err != nil {
		return t, fmt.Errorf("pod template %s: %w", path, err)
	}
	if err := job.ValidateTemplate(t); err != nil {
		return t, fmt.Errorf("pod template %s: %w", path, err)
	}
	return t, nil
}

// loadTemplateObject reads --pod-template-object, if given.
func loadTemplateObject(ctx context.Context, c config, restCfg *rest.Config) (*templateStore, error) {
	if c.templateObject == "" {
		return nil, nil
	}
	ns, name, err := parseObjectRef(c.templateObject)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	s := &templateStore{namespace: ns, name: name, client: cs, log: logr.FromContextOrDiscard(ctx)}
	if err := s.load(ctx, cs); err != nil {
		return nil, err
	}
	return s, nil
}
