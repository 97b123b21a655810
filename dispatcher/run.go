package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/runwarden/runwarden/dispatcher/gitea"
	"github.com/runwarden/runwarden/dispatcher/job"
	rwkube "github.com/runwarden/runwarden/dispatcher/kube"
	"github.com/runwarden/runwarden/dispatcher/metrics"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/preflight"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/kube"
	"github.com/runwarden/runwarden/internal/logging"
	"github.com/runwarden/runwarden/internal/memlimit"
	"github.com/runwarden/runwarden/internal/version"
)

// parse reads the command line into a config, with its defaults filled in
// and checked.
func parse(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	var l lists
	srcs := sources()
	fs := flag.NewFlagSet("runwarden-dispatcher", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.bind(fs, &l, srcs)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.version {
		return c, nil
	}
	for _, step := range []func() error{
		func() error { return c.defaultID(getenv) },
		c.checkLimits,
		func() error { return c.queue.check(l.priorities) },
		c.checkDurations,
		func() error { return c.leader.check(c.namespace) },
		func() error { return c.chooseSource(fs, srcs) },
		func() error { return c.readLists(l) },
	} {
		if err := step(); err != nil {
			return c, err
		}
	}
	return c, nil
}

// sources are the task sources the dispatcher offers (--source), the first
// the default. Each owns its flags, their checks and its setup (see
// runner.Source): a new source is one more here.
func sources() *runner.Sources {
	return runner.NewSources(&rwkube.Config{}, &orchestrator.Config{}, &gitea.Config{})
}

// chooseSource chooses the source --source names, its flags checked;
// another source's flags are refused (runner.Sources.Choose).
func (c *config) chooseSource(fs *flag.FlagSet, srcs *runner.Sources) error {
	if c.testRunner != "" && c.namespace == "" {
		return errors.New("--test-runner needs --namespace, where runner Jobs run")
	}
	src, err := srcs.Choose(fs, c.sourceName, runner.Shared{DispatcherID: c.id, Namespace: c.namespace})
	if err != nil {
		return err
	}
	c.source = src
	return nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "steps" {
		return stepsCmd(ctx, args[1:], stdout, stderr)
	}
	c, err := parse(args, os.Getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-dispatcher: %v\n", err)
		return 2
	}
	if c.version {
		fmt.Fprintf(stdout, "runwarden-dispatcher %s\n", version.String())
		return 0
	}
	tmpl, err := readTemplate(c.template)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-dispatcher: %v\n", err)
		return 2
	}
	logger, err := logging.New(c.logLevel, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-dispatcher: %v\n", err)
		return 2
	}
	ctrllog.SetLogger(logger)
	ctx = logr.NewContext(ctx, logger)
	if c.testRunner != "" {
		if err := testRunner(ctx, c, tmpl, stdout); err != nil {
			fmt.Fprintf(stderr, "runwarden-dispatcher: %v\n", err)
			return 1
		}
		return 0
	}
	if err := serve(ctx, c, tmpl); err != nil {
		logger.Error(err, "dispatcher stopped")
		return 1
	}
	return 0
}

// testRunner runs --test-runner's one runner Job.
func testRunner(ctx context.Context, c config, tmpl corev1.PodTemplateSpec, stdout io.Writer) error {
	restCfg, err := kube.RestConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	if templates, err := loadTemplateObject(ctx, c, restCfg); err != nil {
		return err
	} else if templates != nil {
		tmpl = templates.Current()
	}
	cl, err := client.New(restCfg, client.Options{})
	if err != nil {
		return err
	}
	logs, err := corev1client.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	return preflight.TestRunner(ctx, preflight.TestRunnerOptions{
		Options: preflight.Options{Client: cl, Namespace: c.namespace,
			Jobs: job.Options{DispatcherID: c.id, Template: tmpl, DefaultDeadline: int64(c.deadline.Seconds()), TTLSecondsAfterFinished: int32(c.ttl.Seconds())}},
		Logs: runner.PodLogs{Client: logs}, Script: c.testRunner, Out: stdout,
	})
}

// serve runs the dispatcher until ctx ends: the preflight, then a manager
// running the task source.
func serve(ctx context.Context, c config, tmpl corev1.PodTemplateSpec) error {
	restCfg, err := kube.RestConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	restCfg.QPS, restCfg.Burst = float32(c.qps), c.burst
	scheme, err := newScheme()
	if err != nil {
		return err
	}
	templates, err := loadTemplateObject(ctx, c, restCfg)
	if err != nil {
		return err
	}
	jobOpts := c.jobOptions(tmpl, templates)
	preflightOpts := jobOpts
	if s, ok := c.source.(runner.Shaper); ok {
		if preflightOpts.Template, err = s.Shape(jobOpts.Template); err != nil {
			return err
		}
	}
	if err := runPreflight(ctx, c, restCfg, scheme, preflightOpts); err != nil {
		return err
	}
	lock, kubeClient, err := c.fencing(restCfg)
	if err != nil {
		return err
	}
	mgr, err := newManager(ctx, c, restCfg, scheme, lock)
	if err != nil {
		return err
	}
	recorder := metrics.New(nil, c.maxConcurrent)
	recorder.Leading(!c.leader.elect)
	if templates != nil {
		// Every replica follows the template, so a new leader starts with
		// the one in force.
		templates.rec = recorder
		go templates.watch(ctx, templates.client)
	}
	if c.leader.elect {
		logr.FromContextOrDiscard(ctx).Info("standing by until this replica leads", "lease", c.leader.namespace+"/runwarden-dispatcher-"+c.id)
		go awaitLead(ctx, mgr, recorder)
	}
	logs, err := corev1client.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	if err := c.source.Setup(runner.Setup{
		Shared:  runner.Shared{DispatcherID: c.id, Namespace: c.namespace},
		Manager: mgr, Client: kubeClient(mgr), Limits: c.limits(), Jobs: jobOpts,
		Logs: runner.PodLogs{Client: logs}, Recorder: recorder,
	}); err != nil {
		return err
	}
	if err := addProbes(mgr, c.leader.elect); err != nil {
		return err
	}
	logr.FromContextOrDiscard(ctx).Info("dispatching tasks", "source", c.source.Name(), "dispatcher", c.id, "maxConcurrent", c.maxConcurrent, "goMemoryLimit", memlimit.Current())
	return mgr.Start(ctx)
}

// runPreflight proves a runner pod is admitted in --namespace (see package
// preflight), unless --preflight=false or there is no --namespace.
func runPreflight(ctx context.Context, c config, restCfg *rest.Config, scheme *runtime.Scheme, jobOpts job.Options) error {
	logger := logr.FromContextOrDiscard(ctx)
	switch {
	case !c.preflight:
		return nil
	case c.namespace == "":
		logger.Info("preflight skipped: it needs --namespace, the namespace runner Jobs run in")
		return nil
	}
	direct, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	start := time.Now()
	if err := preflight.Run(ctx, preflight.Options{Client: direct, Jobs: jobOpts, Namespace: c.namespace, Timeout: c.preflightWait}); err != nil {
		return err
	}
	logger.Info("preflight passed: a runner pod was admitted", "namespace", c.namespace, "took", time.Since(start).Round(time.Millisecond).String())
	logEnvFiles(logger, preflight.EnvFiles(ctx, preflight.Options{Client: direct, Jobs: jobOpts, Namespace: c.namespace}), c.secretDelivery)
	return nil
}

// logEnvFiles reports the preflight's EnvFiles check: a cluster without
// EnvFiles is an error only when the platform delivers secret values in env
// files; with secretDelivery: files it is what the platform chose for.
func logEnvFiles(logger logr.Logger, err error, delivery string) {
	switch {
	case errors.Is(err, preflight.ErrNoEnvFiles) && delivery == "files":
		logger.Info("this cluster does not take env files; runner variables holding secret references are delivered as files, as the platform configuration's secretDelivery: files says", "reason", err.Error())
	case errors.Is(err, preflight.ErrNoEnvFiles):
		logger.Error(err, "runner variables holding secret references cannot be resolved into env files on this cluster; set the platform configuration's secretDelivery: files (webhook.platform.secretDelivery) to deliver them as files (docs/secrets.md)")
	case err != nil:
		logger.Error(err, "could not check whether the cluster takes env files")
	}
}
