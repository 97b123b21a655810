package runner

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/metrics"
)

// Source is a task source as the dispatcher's command line offers it
// (--source NAME): the source's package owns its flags, their defaults and
// checks, and how it is set up on the manager, so the command knows only
// the flags every source shares. Bind, Check and Setup are called in that
// order, Check and Setup only on the source chosen.
type Source interface {
	// Name is the source's --source value.
	Name() string
	// Summary says where its tasks come from, for --source's help, e.g.
	// "RunnerTask objects".
	Summary() string
	// Bind defines the source's own flags, with their defaults, on fs.
	// Every source offered binds its flags, whichever is chosen, so --help
	// lists them all and one given with another source is refused by name
	// (Sources.Choose) rather than unknown.
	Bind(fs *flag.FlagSet)
	// Check checks the source's flags once they are parsed, and what it
	// needs of the shared ones.
	Check(s Shared) error
	// Setup adds the source to the manager, which runs it once this
	// replica leads: what talks to the source's tasks' origin starts then,
	// as a manager Runnable, not here.
	Setup(s Setup) error
}

// Shaper is a Source whose runner pods are not the pod template as it is
// (the Gitea source adds its steps program's init container and volumes):
// the preflight proves a pod so shaped is admitted.
type Shaper interface {
	Shape(tmpl corev1.PodTemplateSpec) (corev1.PodTemplateSpec, error)
}

// Shared are the shared settings a source's checks and setup may read.
type Shared struct {
	// DispatcherID is --dispatcher-id, defaulted: the name on its Jobs.
	DispatcherID string
	// Namespace is --namespace: where the dispatcher's Jobs run and whose
	// objects its cache holds; "" is every namespace.
	Namespace string
}

// Outside refuses an object the dispatcher believes (a runner pod
// template, a runner registration) kept in --namespace, where runner Jobs
// run: whoever may write that kind of object there (a tenant, a runner's
// service account) would decide what the dispatcher runs. flag and value
// name the object as given; kind says what that writer could change.
func (s Shared) Outside(flag, value, namespace, kind string) error {
	if s.Namespace != "" && namespace == s.Namespace {
		return fmt.Errorf("%s %q: not in --namespace %s, where runner Jobs run: whoever may %s there would decide what the dispatcher runs; keep it where only the platform writes (the chart: its release namespace)", flag, value, namespace, kind)
	}
	return nil
}

// Setup is what the dispatcher hands the source it runs.
type Setup struct {
	Shared
	// Manager runs the source, with its cache and its API reader
	// (GetAPIReader).
	Manager ctrl.Manager
	// Client reads from the manager's cache and writes; with leader
	// election each write ends where the lease may be lost.
	Client client.Client
	// Limits are the shared limits (--max-concurrent, --max-queued, the
	// timeouts and history), for the source's Options.
	Limits Options
	// Jobs says how Jobs are built.
	Jobs job.Options
	// Logs reads runner pods' logs through the API server.
	Logs LogReader
	// Recorder is the dispatcher's metrics, which hold the source's own
	// counts too. Required: a nil one would reach the source's Options as
	// a Recorder that is not nil.
	Recorder *metrics.Recorder
}

// Sources are the task sources a dispatcher offers, the first the default.
// The dispatcher's command lists them; a source never registers itself.
type Sources struct {
	list []Source
	// owner names the source of each source's flag, as Bind found them.
	owner map[string]string
}

// NewSources offers list, the first the default; names must differ.
func NewSources(list ...Source) *Sources {
	return &Sources{list: list, owner: map[string]string{}}
}

// Default is the name of the source chosen when --source is not given.
func (s *Sources) Default() string {
	return s.list[0].Name()
}

// Usage says what each source is, for --source's help: "kube (RunnerTask
// objects) or orchestrator (...)".
func (s *Sources) Usage() string {
	parts := make([]string, len(s.list))
	for i, src := range s.list {
		parts[i] = fmt.Sprintf("%s (%s)", src.Name(), src.Summary())
	}
	return orList(parts)
}

// Bind binds every source's flags on fs and notes which source owns each.
func (s *Sources) Bind(fs *flag.FlagSet) {
	for _, src := range s.list {
		before := map[string]bool{}
		fs.VisitAll(func(f *flag.Flag) { before[f.Name] = true })
		src.Bind(fs)
		fs.VisitAll(func(f *flag.Flag) {
			if !before[f.Name] {
				s.owner[f.Name] = src.Name()
			}
		})
	}
}

// Choose returns the source called name with its flags checked, once fs
// is parsed. A flag of another source given on the command line is
// refused, naming the source it needs, rather than ignored: the dispatcher
// would run with a value other than the one given.
func (s *Sources) Choose(fs *flag.FlagSet, name string, shared Shared) (Source, error) {
	var chosen Source
	names := make([]string, len(s.list))
	for i, src := range s.list {
		names[i] = src.Name()
		if src.Name() == name {
			chosen = src
		}
	}
	if chosen == nil {
		return nil, fmt.Errorf("--source %q: must be %s", name, orList(names))
	}
	if err := chosen.Check(shared); err != nil {
		return nil, err
	}
	// fs.Visit goes in name order: the flags of each source in that order,
	// the sources in the order of their first flag.
	var others []string
	foreign := map[string][]string{}
	fs.Visit(func(f *flag.Flag) {
		if owner, ok := s.owner[f.Name]; ok && owner != name {
			if foreign[owner] == nil {
				others = append(others, owner)
			}
			foreign[owner] = append(foreign[owner], "--"+f.Name)
		}
	})
	if len(others) == 0 {
		return chosen, nil
	}
	msgs := make([]string, len(others))
	for i, owner := range others {
		msgs[i] = fmt.Sprintf("%s: need --source=%s", strings.Join(foreign[owner], ", "), owner)
	}
	return nil, errors.New(strings.Join(msgs, "; "))
}

// orList joins items as "a, b or c".
func orList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}
