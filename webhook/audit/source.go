package audit

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kjson "sigs.k8s.io/json"

	"github.com/runwarden/runwarden/internal/contract"
)

// Recorded are the runner Jobs and pods an audit reads.
type Recorded struct {
	Jobs []batchv1.Job
	Pods []corev1.Pod
}

// ErrForbidden is a read the caller's credentials may not make.
var ErrForbidden = errors.New("forbidden")

// ListRunners reads the runner Jobs (those of runwarden's dispatcher) and
// runner pods of namespace ns ("" for every namespace) created since
// since (the zero time: all), from the API server, page by page.
func ListRunners(ctx context.Context, r client.Reader, ns string, since time.Time) (Recorded, error) {
	var rec Recorded
	dispatcher, err := labels.NewRequirement(contract.LabelDispatcher, selection.Exists, nil)
	if err != nil {
		return rec, err
	}
	var jobs batchv1.JobList
	err = listPages(ctx, r, &jobs, ns, labels.NewSelector().Add(*dispatcher), "jobs.batch", func() {
		for _, j := range jobs.Items {
			if !j.CreationTimestamp.Time.Before(since) {
				rec.Jobs = append(rec.Jobs, j)
			}
		}
	})
	if err != nil {
		return rec, err
	}
	var pods corev1.PodList
	err = listPages(ctx, r, &pods, ns, labels.SelectorFromSet(labels.Set{contract.LabelRunner: "true"}), "pods", func() {
		for _, p := range pods.Items {
			if !p.CreationTimestamp.Time.Before(since) {
				rec.Pods = append(rec.Pods, p)
			}
		}
	})
	if err != nil {
		return rec, err
	}
	return rec, nil
}

// listPages lists page by page into list, calling page after each.
func listPages(ctx context.Context, r client.Reader, list client.ObjectList, ns string, sel labels.Selector, resource string, page func()) error {
	opts := []client.ListOption{client.MatchingLabelsSelector{Selector: sel}, client.Limit(500)}
	if ns != "" {
		opts = append(opts, client.InNamespace(ns))
	}
	for {
		if err := r.List(ctx, list, opts...); err != nil {
			where := "in namespace " + ns
			if ns == "" {
				where = "in every namespace"
			}
			if apierrors.IsForbidden(err) {
				return fmt.Errorf("listing %s %s: %w: grant list on %s there (%w)", resource, where, ErrForbidden, resource, err)
			}
			return fmt.Errorf("listing %s %s: %w", resource, where, err)
		}
		page()
		next := list.GetContinue()
		if next == "" {
			return nil
		}
		opts = append(opts, client.Continue(next))
	}
}

// ReadFiles reads the Jobs and pods of every .yaml, .yml and .json file in
// dir (not below): single objects, several YAML documents, and lists
// (`kubectl get pods -o yaml`). Other kinds are skipped.
func ReadFiles(dir string) (Recorded, map[string]string, error) {
	var rec Recorded
	files := map[string]string{} // namespace/kind/name -> file
	entries, err := os.ReadDir(dir)
	if err != nil {
		return rec, nil, err
	}
	for _, e := range entries {
		ext := strings.ToLower(filepath.Ext(e.Name()))
		if e.IsDir() || !slices.Contains([]string{".yaml", ".yml", ".json"}, ext) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			return rec, nil, err
		}
		if err := readObjects(b, path, &rec, files); err != nil {
			return rec, nil, err
		}
	}
	if len(rec.Jobs)+len(rec.Pods) == 0 {
		return rec, nil, fmt.Errorf("%s holds no Job or Pod (files .yaml, .yml or .json): %w", dir, fs.ErrNotExist)
	}
	return rec, files, nil
}

// readObjects adds the Jobs and pods of one file's documents to rec.
func readObjects(b []byte, path string, rec *Recorded, files map[string]string) error {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for i := 0; ; i++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: document %d: %w", path, i+1, err)
		}
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		if err := addObject(raw, path, i+1, rec, files); err != nil {
			return err
		}
	}
}

func addObject(raw json.RawMessage, path string, doc int, rec *Recorded, files map[string]string) error {
	var head struct {
		Kind  string            `json:"kind"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return fmt.Errorf("%s: document %d: %w", path, doc, err)
	}
	switch head.Kind {
	case "List", "PodList", "JobList":
		for _, item := range head.Items {
			if err := addObject(item, path, doc, rec, files); err != nil {
				return err
			}
		}
	case "Pod":
		var p corev1.Pod
		if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, &p); err != nil {
			return fmt.Errorf("%s: document %d: pod: %w", path, doc, err)
		}
		p.Namespace = cmp.Or(p.Namespace, "default")
		rec.Pods = append(rec.Pods, p)
		files[p.Namespace+"/Pod/"+p.Name] = path
	case "Job":
		var j batchv1.Job
		if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, &j); err != nil {
			return fmt.Errorf("%s: document %d: job: %w", path, doc, err)
		}
		j.Namespace = cmp.Or(j.Namespace, "default")
		rec.Jobs = append(rec.Jobs, j)
		files[j.Namespace+"/Job/"+j.Name] = path
	}
	return nil
}
