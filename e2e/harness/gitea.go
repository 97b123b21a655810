package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Gitea is a real Gitea server (the pinned one of hack/tools.sh) for the
// Gitea source's suites: a local process with SQLite, an admin user with an
// API token, and a runner registration token for the whole instance.
type Gitea struct {
	// URL is its ROOT_URL, with a trailing slash.
	URL string
	// Admin is the admin user's name; Token its API token.
	Admin, Token string
	// RegistrationToken registers runners for the whole instance.
	RegistrationToken string

	bin, config string
	log         *LockedBuffer
	http        *http.Client
	// password is the admin's, for the web UI's session (web).
	password string
	web      *http.Client
}

// StartGitea starts the pinned Gitea of the checkout at root (make e2e
// builds it), listening on addr (a free port of it), and stops it when the
// test ends. Runner pods reach it at addr when that is the real node's
// gateway.
func StartGitea(ctx context.Context, t testing.TB, root, addr string) *Gitea {
	t.Helper()
	out, err := exec.CommandContext(ctx, filepath.Join(root, "hack", "tools.sh"), "path", "gitea").Output()
	if err != nil {
		t.Fatalf("hack/tools.sh path gitea: %v", err)
	}
	bin := filepath.Join(strings.TrimSpace(string(out)), "gitea")
	dir := t.TempDir()
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &Gitea{
		URL: fmt.Sprintf("http://%s/", net.JoinHostPort(addr, fmt.Sprint(port))), Admin: "runwarden",
		RegistrationToken: rand.Text() + rand.Text(),
		bin:               bin, config: filepath.Join(dir, "app.ini"), log: &LockedBuffer{},
		http: &http.Client{Timeout: 2 * time.Minute},
	}
	// Gitea writes the secrets it generates into its configuration: it
	// must be a file of its own, writable.
	ini := fmt.Sprintf(`WORK_PATH = %[1]s
RUN_MODE = prod
I_AM_BEING_UNSAFE_RUNNING_AS_ROOT = true

[server]
PROTOCOL = http
HTTP_ADDR = %[6]s
HTTP_PORT = %[2]d
ROOT_URL = %[3]s
DISABLE_SSH = true
START_SSH_SERVER = false
OFFLINE_MODE = true
LFS_START_SERVER = false
APP_DATA_PATH = %[1]s/data
STATIC_ROOT_PATH = %[4]s

[database]
DB_TYPE = sqlite3
PATH = %[1]s/data/gitea.db

[repository]
ROOT = %[1]s/repos

[security]
INSTALL_LOCK = true
SECRET_KEY = %[5]s

[service]
DISABLE_REGISTRATION = true

[log]
MODE = console
LEVEL = warn

[actions]
ENABLED = true

[cron.update_checker]
ENABLED = false
`, dir, port, s.URL, filepath.Join(filepath.Dir(bin), "static"), rand.Text(), addr)
	if err := os.WriteFile(s.config, []byte(ini), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "web", "--config", s.config, "--work-path", dir)
	cmd.Env = append(os.Environ(), "GITEA_RUNNER_REGISTRATION_TOKEN="+s.RegistrationToken, "HOME="+dir)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("gitea's log:\n%s", s.log.String())
		}
	})
	up := func(ctx context.Context) (bool, error) {
		select {
		case <-done:
			return false, fmt.Errorf("gitea exited at start:\n%s", s.log.String())
		default:
		}
		return s.API(ctx, http.MethodGet, "version", nil, nil) == nil, nil
	}
	if err := WaitFor(ctx, "Gitea to answer", 2*time.Minute, up); err != nil {
		t.Fatalf("%v\n%s", err, s.log.String())
	}
	s.password = rand.Text()
	out, err = exec.CommandContext(ctx, bin, "admin", "user", "create", "--config", s.config, "--work-path", dir,
		"--username", s.Admin, "--password", s.password, "--email", "runwarden@example.com", "--admin",
		"--must-change-password=false", "--access-token", "--access-token-scopes", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("gitea admin user create: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)\b([0-9a-f]{40})\b`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("gitea admin user create printed no access token:\n%s", out)
	}
	s.Token = string(m[1])
	return s
}

// CancelRun cancels a run (by its ID, which is its number in a repository
// that has all the instance's runs) as a user would from its page: Gitea
// v1.26.0's REST API has no call to cancel a run, so this signs in to the
// web UI as the admin and posts the page's cancel.
func (s *Gitea) CancelRun(ctx context.Context, repo string, run int64) error {
	if s.web == nil {
		jar, err := cookiejar.New(nil)
		if err != nil {
			return err
		}
		web := &http.Client{Timeout: 2 * time.Minute, Jar: jar}
		form := url.Values{"user_name": {s.Admin}, "password": {s.password}}
		if _, err := s.webPost(ctx, web, "user/login", "application/x-www-form-urlencoded", form.Encode()); err != nil {
			return fmt.Errorf("signing in to Gitea's web UI: %w", err)
		}
		u, err := url.Parse(s.URL)
		if err != nil {
			return err
		}
		if len(jar.Cookies(u)) == 0 {
			return errors.New("signing in to Gitea's web UI: no session cookie")
		}
		s.web = web
	}
	b, err := s.webPost(ctx, s.web, fmt.Sprintf("%s/%s/actions/runs/%d/cancel", s.Admin, repo, run), "application/json", "{}")
	if err != nil {
		return fmt.Errorf("cancelling run %d: %w", run, err)
	}
	if bytes.Contains(b, []byte(`name="user_name"`)) {
		return fmt.Errorf("cancelling run %d: Gitea answered with its sign-in page", run)
	}
	return nil
}

func (s *Gitea) webPost(ctx context.Context, c *http.Client, path, contentType, body string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		return nil, fmt.Errorf("POST %s: %s: %.300s", path, resp.Status, b)
	}
	return b, nil
}

// API calls Gitea's REST API (/api/v1/path) as the admin, sending in as
// JSON and decoding the answer into out.
func (s *Gitea) API(ctx context.Context, method, path string, in, out any) error {
	return s.call(ctx, s.http, method, path, in, out)
}

// slowCall is API for a call Gitea may take minutes to answer on a loaded
// machine (a repository made, a commit, a fork, a pull request: Gitea runs
// git), bounded by ctx alone.
func (s *Gitea) slowCall(ctx context.Context, method, path string, in, out any) error {
	return s.call(ctx, &http.Client{}, method, path, in, out)
}

func (s *Gitea) call(ctx context.Context, c *http.Client, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL+"api/v1/"+strings.TrimPrefix(path, "/"), body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if s.Token != "" {
		req.Header.Set("Authorization", "token "+s.Token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if out != nil {
		if raw, ok := out.(*[]byte); ok {
			*raw = b
			return nil
		}
		return json.Unmarshal(b, out)
	}
	return nil
}

// CreateRepo creates the admin's repository name, with a first commit.
func (s *Gitea) CreateRepo(ctx context.Context, name string) error {
	// Gitea initialises the repository with a commit: git, which took past
	// 30 s under the whole suite's load.
	return s.slowCall(ctx, http.MethodPost, "user/repos", map[string]any{"name": name, "auto_init": true, "default_branch": "main"}, nil)
}

// PutFile commits a file to the admin's repository's main branch; a
// workflow file starts a run.
func (s *Gitea) PutFile(ctx context.Context, repo, path, content string) error {
	return s.slowCall(ctx, http.MethodPost, fmt.Sprintf("repos/%s/%s/contents/%s", s.Admin, repo, path), map[string]any{
		"content": base64.StdEncoding.EncodeToString([]byte(content)), "message": "add " + path, "branch": "main",
	}, nil)
}

// PutFiles commits files (path to content) to the admin's repository's
// main branch in one commit: each workflow among them with a matching push
// trigger starts one run.
func (s *Gitea) PutFiles(ctx context.Context, repo string, files map[string]string) error {
	var ops []map[string]any
	for _, p := range slices.Sorted(maps.Keys(files)) {
		ops = append(ops, map[string]any{"operation": "create", "path": p, "content": base64.StdEncoding.EncodeToString([]byte(files[p]))})
	}
	return s.slowCall(ctx, http.MethodPost, fmt.Sprintf("repos/%s/%s/contents", s.Admin, repo), map[string]any{
		"files": ops, "message": "add files", "branch": "main",
	}, nil)
}

// RegistrationTokenFile writes the runner registration token to a file
// of the test's, as a Secret's key mounted in the dispatcher holds it (a
// newline after it), and returns its path.
func (s *Gitea) RegistrationTokenFile(t testing.TB) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "registration-token")
	if err := os.WriteFile(file, []byte(s.RegistrationToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// CreateOrg creates an organization the admin owns.
func (s *Gitea) CreateOrg(ctx context.Context, name string) error {
	return s.API(ctx, http.MethodPost, "orgs", map[string]any{"username": name}, nil)
}

// Fork forks the admin's repository into the organization org.
func (s *Gitea) Fork(ctx context.Context, repo, org string) error {
	return s.slowCall(ctx, http.MethodPost, fmt.Sprintf("repos/%s/%s/forks", s.Admin, repo), map[string]any{"organization": org}, nil)
}

// PutFilesOn commits files to a new branch of owner's repository, made
// from its main branch.
func (s *Gitea) PutFilesOn(ctx context.Context, owner, repo, branch string, files map[string]string) error {
	var ops []map[string]any
	for _, p := range slices.Sorted(maps.Keys(files)) {
		ops = append(ops, map[string]any{"operation": "create", "path": p, "content": base64.StdEncoding.EncodeToString([]byte(files[p]))})
	}
	return s.slowCall(ctx, http.MethodPost, fmt.Sprintf("repos/%s/%s/contents", owner, repo), map[string]any{
		"files": ops, "message": "change on " + branch, "branch": "main", "new_branch": branch,
	}, nil)
}

// OpenPull opens a pull request on the admin's repository from head
// ("branch", or "owner:branch" of a fork) into its main branch.
func (s *Gitea) OpenPull(ctx context.Context, repo, head string) error {
	return s.slowCall(ctx, http.MethodPost, fmt.Sprintf("repos/%s/%s/pulls", s.Admin, repo), map[string]any{
		"head": head, "base": "main", "title": "change from " + head,
	}, nil)
}

// SetSecret sets an Actions secret of the admin's repository.
func (s *Gitea) SetSecret(ctx context.Context, repo, name, value string) error {
	return s.API(ctx, http.MethodPut, fmt.Sprintf("repos/%s/%s/actions/secrets/%s", s.Admin, repo, name), map[string]any{"data": value}, nil)
}

// GiteaJob is an Actions job as the REST API shows it.
type GiteaJob struct {
	ID         int64  `json:"id"`
	RunID      int64  `json:"run_id"`
	Name       string `json:"name"`
	Status     string `json:"status"`
	Conclusion string `json:"conclusion"`
	Steps      []struct {
		Name       string `json:"name"`
		Number     int    `json:"number"`
		Status     string `json:"status"`
		Conclusion string `json:"conclusion"`
	} `json:"steps"`
}

// Jobs lists the jobs of the repository's runs, newest run first.
func (s *Gitea) Jobs(ctx context.Context, repo string) ([]GiteaJob, error) {
	var runs struct {
		Runs []struct {
			ID int64 `json:"id"`
		} `json:"workflow_runs"`
	}
	if err := s.API(ctx, http.MethodGet, fmt.Sprintf("repos/%s/%s/actions/runs", s.Admin, repo), nil, &runs); err != nil {
		return nil, err
	}
	var all []GiteaJob
	for _, r := range runs.Runs {
		var jobs struct {
			Jobs []GiteaJob `json:"jobs"`
		}
		if err := s.API(ctx, http.MethodGet, fmt.Sprintf("repos/%s/%s/actions/runs/%d/jobs", s.Admin, repo, r.ID), nil, &jobs); err != nil {
			return nil, err
		}
		all = append(all, jobs.Jobs...)
	}
	return all, nil
}

// JobCount is how many jobs the repository's runs have, as the REST API
// counts them (X-Total-Count).
func (s *Gitea) JobCount(ctx context.Context, repo string) (int, error) {
	var runs struct {
		Runs []struct {
			ID int64 `json:"id"`
		} `json:"workflow_runs"`
	}
	if err := s.API(ctx, http.MethodGet, fmt.Sprintf("repos/%s/%s/actions/runs", s.Admin, repo), nil, &runs); err != nil {
		return 0, err
	}
	total := 0
	for _, r := range runs.Runs {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%sapi/v1/repos/%s/%s/actions/runs/%d/jobs?limit=1", s.URL, s.Admin, repo, r.ID), nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "token "+s.Token)
		resp, err := s.http.Do(req)
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("the jobs of run %d: %s", r.ID, resp.Status)
		}
		n, err := strconv.Atoi(resp.Header.Get("X-Total-Count"))
		if err != nil {
			return 0, fmt.Errorf("the jobs of run %d: X-Total-Count %q", r.ID, resp.Header.Get("X-Total-Count"))
		}
		total += n
	}
	return total, nil
}

// StepStatuses are the statuses of a job's steps as Gitea's web page shows
// them ("success", "failure", "skipped", ...), without the "Set up job" and
// "Complete job" the page adds around them: the REST API of this Gitea
// gives each step its job's status instead. The page's JSON is read
// anonymously (the repository is public); a request without Origin and
// Sec-Fetch-Site headers is not cross-origin.
func (s *Gitea) StepStatuses(ctx context.Context, repo string, run, job int64) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s%s/%s/actions/runs/%d/jobs/%d", s.URL, s.Admin, repo, run, job), strings.NewReader(`{"logCursors":[]}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the job's page: %s: %.300s", resp.Status, b)
	}
	var view struct {
		State struct {
			CurrentJob struct {
				Steps []struct {
					Status string `json:"status"`
				} `json:"steps"`
			} `json:"currentJob"`
		} `json:"state"`
	}
	if err := json.Unmarshal(b, &view); err != nil {
		return nil, fmt.Errorf("the job's page: %w", err)
	}
	steps := view.State.CurrentJob.Steps
	if len(steps) < 2 {
		return nil, fmt.Errorf("the job's page shows %d steps, not even Set up job and Complete job", len(steps))
	}
	out := make([]string, 0, len(steps)-2)
	for _, st := range steps[1 : len(steps)-1] {
		out = append(out, st.Status)
	}
	return out, nil
}

// Log is a job's log as Gitea keeps it: lines of a timestamp and the row.
func (s *Gitea) Log(ctx context.Context, repo string, job int64) (string, error) {
	var b []byte
	err := s.API(ctx, http.MethodGet, fmt.Sprintf("repos/%s/%s/actions/jobs/%d/logs", s.Admin, repo, job), nil, &b)
	return string(b), err
}
