package render

import (
	"path/filepath"
	"slices"

	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/openapi"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// WarmSchema starts decoding, in the background, the Kubernetes OpenAPI
// schema built into Kustomize, when the overlay needs it (see
// needsSchema). Strategic merge patches look up in it how to merge each
// field; the library decodes it on first use, about 23 ms on one core,
// under a lock every build takes at its start (openapi.SetSchema). Called
// before the input is read, it runs beside the reading and parsing that do
// not need it. An overlay that needs no schema is not made to wait for it:
// its builds start at once, and the 23 ms of CPU are not spent. Render does
// not depend on it: the library decodes the schema once, under its own
// lock, whoever asks first (a resource whose kind the library's own table
// of built-in kinds lacks, say, when Kustomize asks whether it is
// namespaced).
func WarmSchema(overlay string) {
	dir, err := filepath.Abs(overlay)
	if err == nil {
		dir, err = filepath.EvalSymlinks(dir)
	}
	if err != nil || needsSchema(newDisk(), dir, 0) {
		go openapi.Schema()
	}
}

// needsSchema reports whether the overlay in dir, its components or its
// bases, may look fields up in the OpenAPI schema whatever the input: a
// strategic merge patch, an openapi or crds field. It errs on true: a
// kustomization it cannot read, a patch it cannot read or parse.
func needsSchema(fs filesys.FileSystem, dir string, depth int) bool {
	if depth > 8 {
		return true
	}
	k, _, err := readKustomization(fs, dir)
	if err != nil {
		return true
	}
	if len(k.PatchesStrategicMerge) > 0 || len(k.OpenAPI) > 0 || len(k.Crds) > 0 { //nolint:staticcheck // deprecated, yet kustomize build still honours it
		return true
	}
	for _, p := range k.Patches {
		text := p.Patch
		if p.Path != "" {
			b, err := readWithin(fs, dir, p.Path)
			if err != nil {
				return true
			}
			text = string(b)
		}
		// A JSON 6902 patch is a list of operations; anything else is a
		// strategic merge patch.
		if n, err := yaml.Parse(text); err != nil || n.YNode().Kind != yaml.SequenceNode {
			return true
		}
	}
	for _, sub := range slices.Concat(k.Resources, k.Components) {
		if d := filepath.Join(dir, sub); fs.IsDir(d) && needsSchema(fs, d, depth+1) {
			return true
		}
	}
	return false
}
