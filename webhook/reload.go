package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/runwarden/runwarden/webhook/metrics"
	"github.com/runwarden/runwarden/webhook/policy"
)

// Reasons of the Events a reload leaves on the webhook's pod.
const (
	ReasonPolicyReloaded      = "PolicyReloaded"
	ReasonPolicyReloadRefused = "PolicyReloadRefused"
	// ReasonUnknownEnforcedRules: the platform configuration's enforcement
	// names rules no policy in force denies by (policy.UnknownEnforcedRules).
	ReasonUnknownEnforcedRules = "UnknownEnforcedRules"
)

// maxEventMessage bounds an Event's message (the API server keeps 1 kB of
// a note); a long compile error is cut, the log has it whole.
const maxEventMessage = 1024

// podRef names the webhook's own pod (--pod-name, --pod-namespace,
// --pod-uid).
type podRef struct {
	namespace, name, uid string
}

// podEventRecorder records Events on the webhook's own pod. A nil one
// records nothing (no --pod-name: the webhook runs outside a pod).
type podEventRecorder struct {
	rec record.EventRecorder
	pod *corev1.ObjectReference
}

// newPodEventRecorder records with rec on the pod ref names.
func newPodEventRecorder(rec record.EventRecorder, ref podRef) *podEventRecorder {
	return &podEventRecorder{rec: rec, pod: &corev1.ObjectReference{
		APIVersion: "v1", Kind: "Pod", Namespace: ref.namespace, Name: ref.name, UID: types.UID(ref.uid),
	}}
}

func (p *podEventRecorder) event(eventType, reason, message string) {
	if p == nil {
		return
	}
	if len(message) > maxEventMessage {
		message = strings.ToValidUTF8(message[:maxEventMessage-len("...")], "") + "..."
	}
	p.rec.Event(p.pod, eventType, reason, message)
}

// podEvents starts sending Events about the pod to the API server; stop
// ends it. Without a pod name it returns a nil recorder.
func podEvents(ctx context.Context, cfg *rest.Config, pod podRef) (*podEventRecorder, func(), error) {
	if pod.name == "" {
		return nil, func() {}, nil
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("making the Event client: %w", err)
	}
	host, _ := os.Hostname()
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events(pod.namespace)})
	rec := b.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "runwarden-webhook", Host: host})
	return newPodEventRecorder(rec, pod), b.Shutdown, nil
}

// reloadReport tells of each reload of the policy folder: in the log, in
// the metrics, and as an Event on the webhook's pod, where `kubectl
// describe pod` and `kubectl events` show a refused change.
type reloadReport struct {
	log    logr.Logger
	rec    *metrics.Recorder
	events *podEventRecorder
	// platform is the platform configuration, whose enforcement is checked
	// against each set's rules.
	platform map[string]any
}

// report is the store's OnReload.
func (r reloadReport) report(s *policy.Set, err error) {
	if err != nil {
		timedOut := errors.Is(err, policy.ErrTimeout)
		r.log.Error(err, "policy reload refused; the last good set stays in force", "timedOut", timedOut)
		r.rec.Reload("", err)
		r.events.event(corev1.EventTypeWarning, ReasonPolicyReloadRefused,
			"changed policies refused, the last good set stays in force: "+err.Error())
		return
	}
	r.log.Info("policies reloaded", "origin", s.Origin, "digest", s.Digest, "tests", s.Tests)
	r.rec.Reload(s.Digest, nil)
	r.events.event(corev1.EventTypeNormal, ReasonPolicyReloaded,
		fmt.Sprintf("policies reloaded from %s: digest %s, %d tests passed", s.Origin, s.Digest, s.Tests))
	r.checkEnforcement(s)
	r.decisionCache(s)
}

// decisionCache tells whether the set s caches its decisions: in the
// metrics, and, when it does not, in the log, with the file, line and form
// that turned the cache off.
func (r reloadReport) decisionCache(s *policy.Set) {
	r.rec.DecisionCache(s.CacheOff)
	if off := s.CacheOff; off != nil {
		r.log.Info(cacheOffMessage, "reason", off.String(), "form", string(off.Form), "file", off.File, "line", off.Line, "digest", s.Digest)
	}
}

// cacheOffMessage says what a set whose decision cache is off costs; the
// log, policy eval and policy test follow it with the reason.
const cacheOffMessage = "the decision cache is off for this policy set: the webhook evaluates the policies for every pod"

// checkEnforcement tells, in the log and as a Warning Event, of the rules
// the enforcement names that the set s cannot deny by: a misspelt rule
// name would otherwise leave the rule meant at its default action unseen.
func (r reloadReport) checkEnforcement(s *policy.Set) {
	unknown := policy.UnknownEnforcedRules(r.platform, s.Rules())
	if len(unknown) == 0 {
		return
	}
	msg := policy.UnknownRulesMessage(unknown)
	r.log.Info("warning: "+msg, "rules", unknown, "digest", s.Digest)
	r.events.event(corev1.EventTypeWarning, ReasonUnknownEnforcedRules, msg)
}
