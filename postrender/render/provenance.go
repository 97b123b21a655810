package render

// Kustomize stamps its own version into the app.kubernetes.io/managed-by
// label of `buildMetadata: [managedByLabel]` ("kustomize-v5.8.2"), and finds
// it by looking for the kustomize CLI's module among the binary's
// dependencies. Linking one small package of that module, pinned in go.mod
// to the CLI release the output must equal, gives the library the same
// version the CLI reports.
import _ "sigs.k8s.io/kustomize/kustomize/v5/commands/version"
