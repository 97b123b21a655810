package gitea

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/runwarden/runwarden/dispatcher/runner"
)

// Config is the Gitea source's part of the dispatcher's command line: its
// flags with their defaults and checks, and setting it up on the manager.
// It is the runner.Source the dispatcher offers as --source=gitea.
type Config struct {
	url          string
	tokenFile    string
	labels       string
	runnerName   string
	identity     string
	stepsImage   string
	caFile       string
	fetchEvery   time.Duration
	reportEvery  time.Duration
	forkPulls    string
	parsedLabels []string
	identityKey  types.NamespacedName
	// templates are --gitea-template's, label to NAMESPACE/NAME.
	templates map[string]types.NamespacedName
}

var _ runner.Source = (*Config)(nil)

// Name implements runner.Source.
func (*Config) Name() string { return "gitea" }

// Summary implements runner.Source.
func (*Config) Summary() string { return "Gitea Actions jobs, as a Gitea runner" }

// Bind implements runner.Source.
func (c *Config) Bind(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "gitea-url", "", "Gitea's base URL (its ROOT_URL), for --source=gitea")
	fs.StringVar(&c.tokenFile, "gitea-registration-token-file", "", "file holding a Gitea runner registration token: read only to register, when the identity Secret holds no runner yet")
	fs.StringVar(&c.labels, "gitea-labels", "", "comma-separated runner labels declared to Gitea: it hands this dispatcher the jobs whose runs-on labels are all among them, and each runs with the dispatcher's pod template")
	fs.Func("gitea-template", "LABEL=NAMESPACE/NAME (repeat the flag): jobs whose runs-on label is LABEL run with that PodTemplate object (read when each job is taken) instead of the dispatcher's pod template; LABEL is declared to Gitea too", c.addTemplate)
	fs.StringVar(&c.runnerName, "gitea-runner-name", "", "the runner's name at Gitea (default: the dispatcher ID)")
	fs.StringVar(&c.identity, "gitea-identity-secret", "", "NAMESPACE/NAME of the Secret that keeps the runner's registration, in a namespace other than --namespace (the dispatcher's own): whoever may write it chooses the runner the dispatcher is")
	fs.StringVar(&c.stepsImage, "gitea-steps-image", "", "image of the init container that installs the steps program into each runner pod: the dispatcher's own image")
	fs.StringVar(&c.caFile, "gitea-ca", "", "PEM bundle of CAs trusted for Gitea, besides the system's")
	fs.DurationVar(&c.fetchEvery, "gitea-fetch-interval", 2*time.Second, "how often Gitea is asked for a job while a slot is free")
	fs.DurationVar(&c.reportEvery, "gitea-report-interval", 3*time.Second, "how often a job's log and steps are sent to Gitea, which is when a cancel there is seen")
	fs.StringVar(&c.forkPulls, "gitea-fork-pull-requests", ForkPullsRefuse, "jobs of pull requests from forks (or by AGit flow, or of comments on pull requests), which Gitea gives no secrets: refuse (failed with the reason, no pod: their code would run in a runner pod with the platform's identity and template) or run (without secret references)")
}

// addTemplate reads one --gitea-template.
func (c *Config) addTemplate(v string) error {
	label, ref, ok := strings.Cut(v, "=")
	ns, name, okRef := strings.Cut(ref, "/")
	if !ok || !okRef || ns == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("%q: want LABEL=NAMESPACE/NAME", v)
	}
	if err := checkLabel(label); err != nil {
		return err
	}
	if c.templates == nil {
		c.templates = map[string]types.NamespacedName{}
	}
	if _, dup := c.templates[label]; dup {
		return fmt.Errorf("label %q has two templates", label)
	}
	c.templates[label] = types.NamespacedName{Namespace: ns, Name: name}
	return nil
}

// checkLabel checks a runner label.
func checkLabel(l string) error {
	if l == "" || strings.ContainsAny(l, ":, \t") {
		return fmt.Errorf("label %q: a label is a name; runwarden runs each job in a pod template, so a label takes no :docker:// or :host part", l)
	}
	return nil
}

// Check implements runner.Source: Gitea's URL, the labels (--gitea-labels
// or --gitea-template), the steps image and --namespace, where the Jobs
// run, are required.
func (c *Config) Check(s runner.Shared) error {
	c.parsedLabels = nil
	seen := map[string]bool{}
	for _, l := range strings.Split(c.labels, ",") {
		if l = strings.TrimSpace(l); l != "" && !seen[l] {
			if err := checkLabel(l); err != nil {
				return fmt.Errorf("--gitea-labels: %w", err)
			}
			seen[l] = true
			c.parsedLabels = append(c.parsedLabels, l)
		}
	}
	for _, l := range slices.Sorted(maps.Keys(c.templates)) {
		if !seen[l] {
			c.parsedLabels = append(c.parsedLabels, l)
		}
	}
	switch {
	case c.url == "":
		return errors.New("--source=gitea needs --gitea-url")
	case s.Namespace == "":
		return errors.New("--source=gitea needs --namespace, where its Jobs run")
	case len(c.parsedLabels) == 0:
		return errors.New("--source=gitea needs --gitea-labels or --gitea-template, the runs-on labels it serves")
	case c.identity == "":
		return errors.New("--source=gitea needs --gitea-identity-secret, NAMESPACE/NAME of the Secret that keeps its runner registration")
	case c.stepsImage == "":
		return errors.New("--source=gitea needs --gitea-steps-image, the dispatcher's own image")
	case c.fetchEvery < 100*time.Millisecond:
		return fmt.Errorf("--gitea-fetch-interval %s: must be at least 100ms", c.fetchEvery)
	case c.reportEvery < 100*time.Millisecond || c.reportEvery > time.Minute:
		return fmt.Errorf("--gitea-report-interval %s: must be between 100ms and 1m (Gitea fails a job without word for ten minutes)", c.reportEvery)
	case c.forkPulls != ForkPullsRefuse && c.forkPulls != ForkPullsRun:
		return fmt.Errorf("--gitea-fork-pull-requests %q: want %s or %s", c.forkPulls, ForkPullsRefuse, ForkPullsRun)
	}
	ns, name, ok := strings.Cut(c.identity, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("--gitea-identity-secret %q: want NAMESPACE/NAME", c.identity)
	}
	// A registration handed over in a Secret of theirs would have the
	// dispatcher run their repositories' jobs.
	if err := s.Outside("--gitea-identity-secret", c.identity, ns, "create Secrets"); err != nil {
		return err
	}
	for _, l := range slices.Sorted(maps.Keys(c.templates)) {
		ref := c.templates[l]
		if err := s.Outside("--gitea-template", l+"="+ref.String(), ref.Namespace, "write PodTemplates"); err != nil {
			return err
		}
	}
	c.identityKey = types.NamespacedName{Namespace: ns, Name: name}
	u, err := url.Parse(c.url)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("--gitea-url %q: want an http or https URL", c.url)
	}
	return nil
}

// Shape implements runner.Shaper: the dispatcher's preflight proves a pod
// shaped for the steps program is admitted, its init container and
// volumes included.
func (c *Config) Shape(tmpl corev1.PodTemplateSpec) (corev1.PodTemplateSpec, error) {
	return PodTemplate(tmpl, c.stepsImage)
}

// Setup implements runner.Source: a Source with its Client, running Jobs
// from the dispatcher's pod template shaped for the steps program.
func (c *Config) Setup(s runner.Setup) error {
	if s.Jobs.Queueing.Kueue {
		return errors.New("--source=gitea does not run with Kueue yet")
	}
	hc, err := httpClient(c.caFile)
	if err != nil {
		return err
	}
	if _, err := PodTemplate(s.Jobs.Template, c.stepsImage); err != nil {
		return err
	}
	if strings.HasPrefix(c.url, "http:") {
		s.Manager.GetLogger().WithName("gitea").Info("--gitea-url is plain http: the runner's token, and each job's workflow, secrets and token, cross the network unencrypted; use https unless no one else can read the network between the dispatcher and Gitea", "url", c.url)
	}
	name := c.runnerName
	if name == "" {
		name = s.DispatcherID
	}
	var token func() (string, error)
	if c.tokenFile != "" {
		token = func() (string, error) {
			b, err := os.ReadFile(c.tokenFile)
			if err != nil {
				return "", fmt.Errorf("reading the registration token: %w", err)
			}
			return strings.TrimSpace(string(b)), nil
		}
	}
	src := New(Options{
		Options: s.Limits,
		Client:  NewClient(hc, c.url), Kube: s.Client, Reader: s.Manager.GetAPIReader(),
		Jobs: s.Jobs, StepsImage: c.stepsImage, Templates: c.templates, Namespace: s.Namespace, Labels: c.parsedLabels,
		Identity: c.identityKey, RunnerName: name,
		RegistrationToken: token, FetchInterval: c.fetchEvery, ReportInterval: c.reportEvery,
		RunForkPullRequests: c.forkPulls == ForkPullsRun,
		Logs:                s.Logs, Recorder: s.Recorder,
	})
	return src.SetupWithManager(s.Manager)
}

// httpClient is the client for Gitea, trusting caFile's CAs besides the
// system's.
func httpClient(caFile string) (*http.Client, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if caFile != "" {
		pool, err := runner.TrustedCAs(caFile, "gitea")
		if err != nil {
			return nil, fmt.Errorf("--gitea-ca: %w", err)
		}
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: t, Timeout: 2 * time.Minute, CheckRedirect: noRedirects}, nil
}

// noRedirects refuses Gitea's redirects: the runner API has none, and
// following one would send the runner's token (its headers go along) and
// the jobs' logs wherever it points.
func noRedirects(req *http.Request, _ []*http.Request) error {
	return fmt.Errorf("gitea redirected to %s: the runner API has no redirects; set --gitea-url to Gitea's ROOT_URL", req.URL.Redacted())
}
