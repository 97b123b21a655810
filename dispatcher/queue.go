package main

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// queueFlags say how tasks wait for a slot.
type queueFlags struct {
	kueue                bool
	maxQueued            int
	defaultQueue         string
	defaultPriorityClass string
	priorities           map[string]int32
}

// check checks how tasks wait, and keeps the priority classes.
func (q *queueFlags) check(priorities priorityFlag) error {
	if q.maxQueued < 1 {
		return fmt.Errorf("--max-queued %d: must be at least 1", q.maxQueued)
	}
	q.priorities = priorities
	for flagName, v := range map[string]string{"--default-queue": q.defaultQueue, "--default-priority-class": q.defaultPriorityClass} {
		if v != "" && len(validation.IsDNS1123Subdomain(v)) > 0 {
			return fmt.Errorf("%s %q: not a valid object name", flagName, v)
		}
	}
	if q.kueue && len(priorities) > 0 {
		return errors.New("--priority-class: with --kueue, tasks name Kueue WorkloadPriorityClasses, whose values Kueue holds; leave --priority-class out")
	}
	if !q.kueue && q.defaultQueue != "" {
		return errors.New("--default-queue needs --kueue")
	}
	if !q.kueue && q.defaultPriorityClass != "" {
		if _, ok := priorities[q.defaultPriorityClass]; !ok {
			return fmt.Errorf("--default-priority-class %q: not one of the --priority-class names", q.defaultPriorityClass)
		}
	}
	return nil
}

// priorityFlag collects repeated --priority-class NAME=VALUE flags.
type priorityFlag map[string]int32

func (p priorityFlag) String() string {
	names := make([]string, 0, len(p))
	for k, v := range p {
		names = append(names, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

func (p priorityFlag) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q: want NAME=VALUE, e.g. high=1000", s)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%q: %s: %s", s, name, strings.Join(errs, "; "))
	}
	v, err := strconv.ParseInt(value, 10, 32)
	if err != nil {
		return fmt.Errorf("%q: the value must be a whole number (32 bits): %w", s, err)
	}
	if _, dup := p[name]; dup {
		return fmt.Errorf("%q: priority class %s given twice", s, name)
	}
	p[name] = int32(v)
	return nil
}
