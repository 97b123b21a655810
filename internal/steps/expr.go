package steps

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/nektos/act/pkg/exprparser"
	"github.com/rhysd/actionlint"
)

// Expressions are evaluated by the interpreter of Gitea's fork of act, the
// one Gitea's own runner evaluates them with; what is runwarden's is only
// where they are found (${{ }} inside text) and how a value becomes text.

// Where an expression is evaluated: its status functions (success(),
// failure()) read the needed jobs' results at the job's level and the
// job's status so far at a step's.
const (
	levelJob  = "job"
	levelStep = "step"
)

// evaluate evaluates one expression (with or without its ${{ }}).
func evaluate(env *exprparser.EvaluationEnvironment, cfg exprparser.Config, expr string, check exprparser.DefaultStatusCheck) (any, error) {
	expr = strings.TrimSpace(expr)
	if strings.HasPrefix(expr, "${{") {
		inner, ok := strings.CutSuffix(expr, "}}")
		if !ok {
			return nil, fmt.Errorf("%q: an expression opened with ${{ is not closed with }}", expr)
		}
		expr = strings.TrimSpace(strings.TrimPrefix(inner, "${{"))
	}
	v, err := exprparser.NewInterpeter(env, cfg).Evaluate(expr, check)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", expr, err)
	}
	return v, nil
}

// condition evaluates an if: as GitHub Actions does: success() unless the
// expression calls a status function itself, then its truthiness.
func condition(env *exprparser.EvaluationEnvironment, cfg exprparser.Config, expr string) (bool, error) {
	v, err := evaluate(env, cfg, expr, exprparser.DefaultStatusCheckSuccess)
	if err != nil {
		return false, err
	}
	return exprparser.IsTruthy(v), nil
}

// interpolate replaces every ${{ expression }} in s with its value as text.
// A "}}" inside a quoted string of the expression does not end it (act's
// lexer finds the end).
func interpolate(env *exprparser.EvaluationEnvironment, cfg exprparser.Config, s string) (string, error) {
	var b strings.Builder
	rest := s
	for {
		i := strings.Index(rest, "${{")
		if i < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		b.WriteString(rest[:i])
		body := rest[i+3:]
		_, end, lexErr := actionlint.LexExpression(body)
		if lexErr != nil {
			return "", fmt.Errorf("%q: %s", strings.TrimSpace(rest[i:]), lexErr.Message)
		}
		v, err := evaluate(env, cfg, body[:end-2], exprparser.DefaultStatusCheckNone)
		if err != nil {
			return "", err
		}
		b.WriteString(text(v))
		rest = body[end:]
	}
}

// text is an expression's value as GitHub Actions writes it into text:
// null as "", whole numbers without a fraction, objects and arrays as JSON.
func text(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case bool:
		return strconv.FormatBool(v)
	case int:
		return strconv.Itoa(v)
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1e15 {
			return strconv.FormatInt(int64(v), 10)
		}
		return strconv.FormatFloat(v, 'g', -1, 64)
	default:
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
}
