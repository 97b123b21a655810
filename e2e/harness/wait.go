package harness

import (
	"context"
	"fmt"
	"time"

	apimachinerywait "k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/e2e-framework/klient/wait"
)

// DefaultInterval is how often WaitFor polls its condition.
const DefaultInterval = 250 * time.Millisecond

// WaitFor polls cond until it is true, it returns an error, or timeout passes.
// The error says what was awaited, so a failing test reads well.
func WaitFor(ctx context.Context, what string, timeout time.Duration, cond apimachinerywait.ConditionWithContextFunc) error {
	return WaitForEvery(ctx, what, timeout, DefaultInterval, cond)
}

// WaitForEvery is WaitFor polling every interval: a benchmark that times
// what it waits for polls more often.
func WaitForEvery(ctx context.Context, what string, timeout, interval time.Duration, cond apimachinerywait.ConditionWithContextFunc) error {
	err := wait.For(cond,
		wait.WithContext(ctx),
		wait.WithTimeout(timeout),
		wait.WithInterval(interval),
		wait.WithImmediate(),
	)
	if err != nil {
		return fmt.Errorf("waiting %s for %s: %w", timeout, what, err)
	}
	return nil
}
