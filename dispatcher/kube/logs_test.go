package kube

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/internal/clocktest"
	"github.com/runwarden/runwarden/internal/contract"
)

// fakeLogs serves one log for every container.
type fakeLogs struct{ log []byte }

func (f fakeLogs) Tail(_ context.Context, _, _, _ string, limit int) ([]byte, error) {
	return f.log[max(len(f.log)-limit, 0):], nil
}

func (f fakeLogs) Follow(context.Context, string, string, string) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(f.log)), nil
}

// A finished task keeps the end of its runner's log in a ConfigMap the
// RunnerTask owns, named in its status: it outlives the Job and its pod.
// A log that is not text is kept as binary data.
func TestFinishedTaskKeepsItsLog(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		log  []byte
		text bool
	}{{"text", []byte("planned 3 changes\napplied\n"), true}, {"binary", []byte{0xff, 0xfe, 'x'}, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rt := runnerTask("a", "uid-a")
			j := runnerJobOf(rt)
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
			pod := runnerPodOf(j, j.Name+"-x")
			api := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithStatusSubresource(&v1alpha1.RunnerTask{}).WithObjects(rt, j, pod).Build()
			r := New(Options{Client: api, Jobs: job.Options{DispatcherID: "d1"}, Logs: fakeLogs{c.log}, KeepLogBytes: 16})
			if err := r.finish(t.Context(), rt, j, job.Outcome{Phase: job.PhaseSucceeded, Reason: job.ReasonCompleted}); err != nil {
				t.Fatal(err)
			}
			var got v1alpha1.RunnerTask
			if err := api.Get(t.Context(), key("a"), &got); err != nil || !strings.HasPrefix(got.Status.LogConfigMap, LogConfigMapPrefix(j.Name)) {
				t.Fatalf("status log ConfigMap %q (%v)", got.Status.LogConfigMap, err)
			}
			var cm corev1.ConfigMap
			if err := api.Get(t.Context(), key(got.Status.LogConfigMap), &cm); err != nil {
				t.Fatal(err)
			}
			want := c.log[max(0, len(c.log)-16):]
			kept := []byte(cm.Data["log"])
			if !c.text {
				kept = cm.BinaryData["log"]
			}
			if !bytes.Equal(kept, want) {
				t.Errorf("kept %q, want %q", kept, want)
			}
			if owner := metav1.GetControllerOf(&cm); owner == nil || owner.UID != rt.UID {
				t.Errorf("the log's owner %+v, want the RunnerTask", owner)
			}
		})
	}
}

// podLogs serves each pod's log.
type podLogs map[string][]byte

func (f podLogs) Tail(_ context.Context, _, pod, _ string, limit int) ([]byte, error) {
	log, ok := f[pod]
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("pods"), pod)
	}
	return log[max(len(log)-limit, 0):], nil
}

func (f podLogs) Follow(_ context.Context, _, pod, _ string) (io.ReadCloser, error) {
	log, ok := f[pod]
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("pods"), pod)
	}
	return io.NopCloser(bytes.NewReader(log)), nil
}

// A pod planted with the job-name label of a task's Job, newer than the
// Job's own pod, is neither the task's record nor the pod whose log is
// kept: whoever may create pods writes that label, any owner reference
// and any record annotation (job.IsPodOf).
func TestKeptLogAndRecordAreTheJobsOwnPods(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		plant func(p *corev1.Pod)
	}{
		{"the job-name label alone", func(p *corev1.Pod) {
			p.Labels, p.OwnerReferences = map[string]string{batchv1.JobNameLabel: p.Labels[batchv1.JobNameLabel]}, nil
		}},
		{"a forged owner reference with another UID", func(p *corev1.Pod) { p.OwnerReferences[0].UID = "forged" }},
		{"no runner label", func(p *corev1.Pod) { delete(p.Labels, contract.LabelRunner) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rt := runnerTask("a", "uid-a")
			j := runnerJobOf(rt)
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
			own := runnerPodOf(j, j.Name+"-own")
			own.CreationTimestamp = metav1.NewTime(time.Unix(1_700_000_000, 0))
			own.Annotations = map[string]string{"runwarden.dev/spec-digest": "sha256:own"}
			own.Spec.NodeName = "node-own"
			planted := runnerPodOf(j, j.Name+"-planted")
			planted.CreationTimestamp = metav1.NewTime(own.CreationTimestamp.Add(time.Minute))
			planted.Annotations = map[string]string{"runwarden.dev/spec-digest": "sha256:planted"}
			planted.Spec.NodeName = "node-planted"
			c.plant(planted)
			api := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithStatusSubresource(&v1alpha1.RunnerTask{}).WithObjects(rt, j, own, planted).Build()
			logs := podLogs{own.Name: []byte("applied\n"), planted.Name: []byte("all went well\n")}
			r := New(Options{Client: api, Jobs: job.Options{DispatcherID: "d1"}, Logs: logs, KeepLogBytes: 1024})
			if err := r.finish(t.Context(), rt, j, job.Outcome{Phase: job.PhaseSucceeded, Reason: job.ReasonCompleted}); err != nil {
				t.Fatal(err)
			}
			var got v1alpha1.RunnerTask
			if err := api.Get(t.Context(), key("a"), &got); err != nil {
				t.Fatal(err)
			}
			if rec := got.Status.Record; rec == nil || rec.Pod != own.Name || rec.SpecDigest != "sha256:own" || rec.Node != "node-own" {
				t.Errorf("record %+v, want the Job's own pod %s", rec, own.Name)
			}
			var cm corev1.ConfigMap
			if err := api.Get(t.Context(), key(got.Status.LogConfigMap), &cm); err != nil {
				t.Fatalf("the kept log %q: %v", got.Status.LogConfigMap, err)
			}
			if cm.Data["log"] != "applied\n" {
				t.Errorf("kept log %q, want the Job's own pod's", cm.Data["log"])
			}
		})
	}
}

// A ConfigMap made ahead under a name the task's log could take is never
// named as its log, even one that says it is the task's (owner reference,
// dispatcher label, task annotation: whoever may create a ConfigMap writes
// those as they please): only the ConfigMap the dispatcher's own create
// made is, under a name the API server draws. A drawn name someone holds
// fails the try and names nothing; the next try draws another. The planted
// ConfigMap is left as it was.
func TestPlantedLogConfigMapIsNeverTaken(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		// plant is the planted ConfigMap's name, given the Job's.
		plant func(jobName string) string
		// drawn: the first name the API server draws is the planted one.
		drawn bool
	}{
		{name: "the job's name with -log", plant: func(j string) string { return j + "-log" }},
		{name: "a name the API server draws", plant: func(j string) string { return LogConfigMapPrefix(j) + "x2x2x" }, drawn: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rt := runnerTask("a", "uid-a")
			j := runnerJobOf(rt)
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
			pod := runnerPodOf(j, j.Name+"-x")
			planted := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{
					Name: c.plant(j.Name), Namespace: "runners",
					Labels:      map[string]string{contract.LabelDispatcher: "d1"},
					Annotations: map[string]string{contract.TaskID: TaskID(rt)},
					OwnerReferences: []metav1.OwnerReference{{
						APIVersion: v1alpha1.GroupVersion.String(), Kind: "RunnerTask", Name: rt.Name, UID: rt.UID, Controller: ptr.To(true),
					}},
				},
				Data: map[string]string{"log": "all went well\n"},
			}
			draws := 0
			api := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithStatusSubresource(&v1alpha1.RunnerTask{}).WithObjects(rt, j, pod, planted).
				WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, cl client.WithWatch, o client.Object, opts ...client.CreateOption) error {
					if cm, ok := o.(*corev1.ConfigMap); ok && cm.GenerateName != "" {
						if draws++; draws == 1 && c.drawn {
							cm.Name = planted.Name
						}
					}
					return cl.Create(ctx, o, opts...)
				}}).Build()
			r := New(Options{Client: api, Jobs: job.Options{DispatcherID: "d1"}, Logs: fakeLogs{[]byte("planned 3 changes\n")}, KeepLogBytes: 1024})
			finish := func() (*v1alpha1.RunnerTask, error) {
				t.Helper()
				var rt v1alpha1.RunnerTask
				if err := api.Get(t.Context(), key("a"), &rt); err != nil {
					t.Fatal(err)
				}
				err := r.finish(t.Context(), &rt, j, job.Outcome{Phase: job.PhaseSucceeded, Reason: job.ReasonCompleted})
				if gerr := api.Get(t.Context(), key("a"), &rt); gerr != nil {
					t.Fatal(gerr)
				}
				return &rt, err
			}
			got, err := finish()
			if c.drawn {
				if !apierrors.IsAlreadyExists(err) || got.Status.LogConfigMap != "" || got.Status.Phase != "" {
					t.Fatalf("a drawn name that is taken: %v, status log ConfigMap %q, phase %q; want the try to fail, naming nothing", err, got.Status.LogConfigMap, got.Status.Phase)
				}
				got, err = finish()
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.LogConfigMap == planted.Name || !strings.HasPrefix(got.Status.LogConfigMap, LogConfigMapPrefix(j.Name)) {
				t.Fatalf("status log ConfigMap %q; want one made by the dispatcher, named %q and 5 drawn characters, not the planted %q",
					got.Status.LogConfigMap, LogConfigMapPrefix(j.Name), planted.Name)
			}
			var kept, after corev1.ConfigMap
			if err := api.Get(t.Context(), key(got.Status.LogConfigMap), &kept); err != nil {
				t.Fatal(err)
			}
			if kept.Data["log"] != "planned 3 changes\n" {
				t.Errorf("kept log %q, want the runner's", kept.Data["log"])
			}
			if err := api.Get(t.Context(), key(planted.Name), &after); err != nil {
				t.Fatalf("the planted ConfigMap: %v", err)
			}
			if diff := cmp.Diff(planted.Data, after.Data); diff != "" || after.ResourceVersion != "999" {
				t.Errorf("the planted ConfigMap was changed (resource version %s, want 999) (-planted +now):\n%s", after.ResourceVersion, diff)
			}
		})
	}
}

// A try whose status update fails (a conflict: the cache's copy of the
// task was stale) has made its ConfigMap already: the next try names that
// one, and keeps no second copy of the log.
func TestLogIsKeptOnceAcrossTries(t *testing.T) {
	t.Parallel()
	rt := runnerTask("a", "uid-a")
	j := runnerJobOf(rt)
	j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	pod := runnerPodOf(j, j.Name+"-x")
	updates := 0
	api := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithStatusSubresource(&v1alpha1.RunnerTask{}).WithObjects(rt, j, pod).
		WithInterceptorFuncs(interceptor.Funcs{SubResourceUpdate: func(ctx context.Context, cl client.Client, sub string, o client.Object, opts ...client.SubResourceUpdateOption) error {
			if updates++; updates == 1 {
				return apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("runnertasks").GroupResource(), o.GetName(), errors.New("the object has been modified"))
			}
			return cl.SubResource(sub).Update(ctx, o, opts...)
		}}).Build()
	r := New(Options{Client: api, Jobs: job.Options{DispatcherID: "d1"}, Logs: fakeLogs{[]byte("applied\n")}, KeepLogBytes: 1024})
	for try := 1; try <= 2; try++ {
		var cur v1alpha1.RunnerTask
		if err := api.Get(t.Context(), key("a"), &cur); err != nil {
			t.Fatal(err)
		}
		err := r.finish(t.Context(), &cur, j, job.Outcome{Phase: job.PhaseSucceeded, Reason: job.ReasonCompleted})
		if (try == 1) != apierrors.IsConflict(err) {
			t.Fatalf("try %d: %v", try, err)
		}
	}
	var got v1alpha1.RunnerTask
	if err := api.Get(t.Context(), key("a"), &got); err != nil {
		t.Fatal(err)
	}
	var cms corev1.ConfigMapList
	if err := api.List(t.Context(), &cms, client.InNamespace("runners")); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, cm := range cms.Items {
		names = append(names, cm.Name)
	}
	if diff := cmp.Diff([]string{got.Status.LogConfigMap}, names); diff != "" {
		t.Errorf("ConfigMaps (-named in the status +made):\n%s", diff)
	}
}

// The API server cuts a generateName beyond 58 characters (63 less the 5
// it draws): the longest Job name leaves the log's prefix whole, which is
// how a reader tells the task's log ConfigMaps.
func TestLogConfigMapPrefixIsNeverCut(t *testing.T) {
	t.Parallel()
	id := strings.Repeat("n", 63) + "/" + strings.Repeat("t", 253) + "/0b9e5b7c-6d46-4b7e-9d0a-3c1c7b0e2f11"
	if p := LogConfigMapPrefix(job.Name(id)); len(p) > 58 {
		t.Errorf("log ConfigMap prefix %q: %d characters, more than the API server keeps (58)", p, len(p))
	}
}

// A pod that cannot pull its image ends the task (ImagePullError) and
// stops its Job only if it is the Job's own: one planted with the Job's
// job-name label (and the task's annotation, so the dispatcher looks at
// once) leaves the task running and its Job as it was.
func TestPlantedPodDoesNotEndTheTask(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		plant func(j *batchv1.Job, p *corev1.Pod)
		want  v1alpha1.Phase
	}{
		{"the Job's own pod (control)", func(*batchv1.Job, *corev1.Pod) {}, v1alpha1.PhaseFailed},
		{"the job-name label alone", func(j *batchv1.Job, p *corev1.Pod) {
			p.Labels, p.OwnerReferences = map[string]string{batchv1.JobNameLabel: j.Name}, nil
		}, v1alpha1.PhaseRunning},
		{"a forged owner reference with another UID", func(_ *batchv1.Job, p *corev1.Pod) { p.OwnerReferences[0].UID = "forged" }, v1alpha1.PhaseRunning},
		{"no runner label", func(_ *batchv1.Job, p *corev1.Pod) { delete(p.Labels, contract.LabelRunner) }, v1alpha1.PhaseRunning},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rt := runnerTask("a", "uid-a")
			api := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithStatusSubresource(&v1alpha1.RunnerTask{}).WithObjects(rt).
				WithIndex(&corev1.Event{}, "involvedObject.name", func(o client.Object) []string { return []string{o.(*corev1.Event).InvolvedObject.Name} }).Build()
			r := New(Options{Client: api, Jobs: job.Options{DispatcherID: "d1"}})
			reconcileTask := func() *v1alpha1.RunnerTask {
				t.Helper()
				if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: key("a")}); err != nil {
					t.Fatalf("reconcile: %v", err)
				}
				got := &v1alpha1.RunnerTask{}
				if err := api.Get(t.Context(), key("a"), got); err != nil {
					t.Fatal(err)
				}
				return got
			}
			if got := reconcileTask(); got.Status.Phase != v1alpha1.PhaseRunning {
				t.Fatalf("phase %q, want Running", got.Status.Phase)
			}
			j := &batchv1.Job{}
			if err := api.Get(t.Context(), key(job.Name(TaskID(rt))), j); err != nil {
				t.Fatal(err)
			}
			if j.UID == "" {
				// The API server gives every object a UID; so must the
				// client here, or no pod would be the Job's.
				j.UID = "job-uid-a"
				if err := api.Update(t.Context(), j); err != nil {
					t.Fatal(err)
				}
			}
			p := runnerPodOf(j, j.Name+"-pulling")
			p.Annotations = map[string]string{contract.TaskID: TaskID(rt)}
			p.Status = corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
				Name: job.RunnerContainer, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "pull access denied"}},
			}}}
			c.plant(j, p)
			if err := api.Create(t.Context(), p); err != nil {
				t.Fatal(err)
			}
			got := reconcileTask()
			if got.Status.Phase != c.want {
				t.Fatalf("phase %q reason %q (%s), want %s", got.Status.Phase, got.Status.Reason, got.Status.Message, c.want)
			}
			if c.want == v1alpha1.PhaseFailed {
				if got.Status.Reason != job.ReasonImagePullError {
					t.Errorf("reason %q, want %s", got.Status.Reason, job.ReasonImagePullError)
				}
				return
			}
			after := &batchv1.Job{}
			if err := api.Get(t.Context(), client.ObjectKeyFromObject(j), after); err != nil || after.DeletionTimestamp != nil || ptr.Deref(after.Spec.Suspend, false) {
				t.Errorf("the Job after the planted pod: %v, deleted at %v, suspended %v; want it running as it was", err, after.DeletionTimestamp, after.Spec.Suspend)
			}
		})
	}
}

// lateLogs serves an empty log for its first reads, then the log: as a
// kubelet that reported the container's exit before its output reached
// the log file.
type lateLogs struct {
	mu         sync.Mutex
	emptyReads int
	reads      int
	log        []byte
}

func (f *lateLogs) Tail(_ context.Context, _, _, _ string, _ int) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.reads <= f.emptyReads {
		return nil, nil
	}
	return f.log, nil
}

func (f *lateLogs) Follow(context.Context, string, string, string) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(f.log)), nil
}

// A log that reads empty is read again, logReadGap apart, up to
// emptyLogReads times: the output that reaches the log file late is kept,
// and a log that stays empty is kept empty after the last read.
func TestEmptyLogIsReadAgain(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		emptyReads int
		want       string
		wantReads  int
	}{
		{"the output arrives on the third read", 2, "hello from the runner\n", 3},
		{"a runner that printed nothing", emptyLogReads + 5, "", emptyLogReads},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rt := runnerTask("a", "uid-a")
			j := runnerJobOf(rt)
			pod := runnerPodOf(j, j.Name+"-x")
			api := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithObjects(rt, j, pod).Build()
			logs := &lateLogs{emptyReads: c.emptyReads, log: []byte("hello from the runner\n")}
			clk := clocktest.New(time.Unix(0, 0))
			r := New(Options{Client: api, Jobs: job.Options{DispatcherID: "d1"}, Logs: logs, KeepLogBytes: 1024})
			r.opts.Clock = clk
			done := make(chan struct{})
			var name string
			var err error
			go func() {
				defer close(done)
				name, err = r.keepLog(t.Context(), rt, j.Name, pod.Name)
			}()
			for range min(c.emptyReads, emptyLogReads-1) {
				if werr := clk.WaitForWaiters(1, 10*time.Second); werr != nil {
					t.Fatal(werr)
				}
				clk.Step(logReadGap)
			}
			<-done
			if err != nil {
				t.Fatal(err)
			}
			var cm corev1.ConfigMap
			if err := api.Get(t.Context(), key(name), &cm); err != nil {
				t.Fatal(err)
			}
			if cm.Data["log"] != c.want || logs.reads != c.wantReads {
				t.Errorf("kept %q after %d reads, want %q after %d", cm.Data["log"], logs.reads, c.want, c.wantReads)
			}
		})
	}
}
