// Package gitea is the dispatcher's task source for Gitea Actions: it
// registers as one of a Gitea server's runners (runner.v1 over Connect, as
// code.gitea.io/actions-proto-go defines it and Gitea serves it), fetches
// jobs while a slot is free, runs each as one Kubernetes Job whose pod runs
// the job's steps (package internal/steps), and reports the steps' states,
// their log lines and the job's result back to Gitea.
package gitea

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"code.gitea.io/actions-proto-go/runner/v1/runnerv1connect"
	"connectrpc.com/connect"

	"github.com/runwarden/runwarden/internal/version"
)

// Identity is the runner runwarden is at a Gitea server: what Register
// gave once, kept in a Secret so every replica and every restart is the
// same runner.
type Identity struct {
	ID    int64
	UUID  string
	Token string
	Name  string
}

// Client calls a Gitea server's runner API.
type Client struct {
	rpc runnerv1connect.RunnerServiceClient

	mu sync.RWMutex
	id Identity
}

// NewClient returns a client of the runner API of the Gitea server at
// server (its ROOT_URL, e.g. https://gitea.example/).
func NewClient(httpClient *http.Client, server string) *Client {
	c := &Client{}
	c.rpc = runnerv1connect.NewRunnerServiceClient(httpClient, strings.TrimRight(server, "/")+"/api/actions",
		connect.WithInterceptors(connect.UnaryInterceptorFunc(c.authenticate)))
	return c
}

// SetIdentity makes later calls as the runner id.
func (c *Client) SetIdentity(id Identity) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.id = id
}

// authenticate adds the runner's UUID and token to every call (Register
// needs neither, and Gitea ignores them there).
func (c *Client) authenticate(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		c.mu.RLock()
		id := c.id
		c.mu.RUnlock()
		if id.UUID != "" {
			req.Header().Set("x-runner-uuid", id.UUID)
			req.Header().Set("x-runner-token", id.Token)
		}
		return next(ctx, req)
	}
}

// Register registers a new runner called name with a registration token;
// its labels are the runs-on labels it takes jobs for.
func (c *Client) Register(ctx context.Context, name, registrationToken string, labels []string) (Identity, error) {
	resp, err := c.rpc.Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{
		Name: name, Token: registrationToken, Labels: labels, Version: runnerVersion(),
	}))
	if err != nil {
		return Identity{}, fmt.Errorf("registering at Gitea: %w", err)
	}
	r := resp.Msg.GetRunner()
	if r.GetUuid() == "" || r.GetToken() == "" {
		return Identity{}, errors.New("registering at Gitea: the answer holds no runner UUID or token")
	}
	return Identity{ID: r.GetId(), UUID: r.GetUuid(), Token: r.GetToken(), Name: r.GetName()}, nil
}

// Declare tells Gitea the runner's labels and version, which replace those
// it registered with.
func (c *Client) Declare(ctx context.Context, labels []string) error {
	_, err := c.rpc.Declare(ctx, connect.NewRequest(&runnerv1.DeclareRequest{Version: runnerVersion(), Labels: labels}))
	if err != nil {
		return fmt.Errorf("declaring the runner's labels at Gitea: %w", err)
	}
	return nil
}

// FetchTask asks for a job. version is the tasks version of the last
// answer (0 after a task was given): Gitea looks for a job only when its
// own has moved past it. It returns the task (nil when none) and Gitea's
// tasks version.
func (c *Client) FetchTask(ctx context.Context, version int64) (*runnerv1.Task, int64, error) {
	resp, err := c.rpc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{TasksVersion: version}))
	if err != nil {
		return nil, 0, fmt.Errorf("fetching a task from Gitea: %w", err)
	}
	return resp.Msg.GetTask(), resp.Msg.GetTasksVersion(), nil
}

// UpdateTask sends a task's state (every step's, every time) and outputs
// Gitea does not hold yet. Gitea answers with the task's result as it
// stands (not unspecified once it ended, cancelled from Gitea among
// others) and the names of the outputs it holds.
func (c *Client) UpdateTask(ctx context.Context, state *runnerv1.TaskState, outputs map[string]string) (*runnerv1.UpdateTaskResponse, error) {
	resp, err := c.rpc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: state, Outputs: outputs}))
	if err != nil {
		return nil, fmt.Errorf("updating task %d at Gitea: %w", state.GetId(), err)
	}
	return resp.Msg, nil
}

// UpdateLog appends rows to a task's log, the first at index; noMore ends
// the log (only with rows). It returns how many rows Gitea holds: rows
// before that index are never asked for again, and an index past it is a
// gap Gitea refuses by answering its own count.
func (c *Client) UpdateLog(ctx context.Context, task, index int64, rows []*runnerv1.LogRow, noMore bool) (int64, error) {
	resp, err := c.rpc.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: task, Index: index, Rows: rows, NoMore: noMore}))
	if err != nil {
		return 0, fmt.Errorf("sending task %d's log to Gitea: %w", task, err)
	}
	return resp.Msg.GetAckIndex(), nil
}

// IsUnregistered says that Gitea does not know the runner (it was deleted
// there, or its token is wrong). Gitea's errors reach a Connect client as
// code unknown, so its message is what tells.
func IsUnregistered(err error) bool {
	return err != nil && strings.Contains(err.Error(), "unregistered runner")
}

// IsUnimplemented says the server lacks the method (Declare, before Gitea
// 1.21).
func IsUnimplemented(err error) bool {
	return connect.CodeOf(err) == connect.CodeUnimplemented
}

// runnerVersion is what Gitea shows as the runner's version.
func runnerVersion() string {
	if version.Version == "" {
		return "runwarden devel"
	}
	return "runwarden " + version.Version
}
