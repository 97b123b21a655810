package render

import (
	"bytes"
	"fmt"
)

// genManifests makes a Helm-like stream of about n documents: tenants of
// five resources each (a ConfigMap, a Secret, a ServiceAccount, a Deployment
// that refers to all three, and a Service), every one with the chart's
// release labels and a "# Source:" comment, as a many-tenant chart renders.
func genManifests(n int) []byte {
	var b bytes.Buffer
	for i := 0; i < (n+4)/5; i++ {
		fmt.Fprintf(&b, `---
# Source: tenants/templates/config.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: cfg-%[1]d
  labels: &labels
    app.kubernetes.io/instance: bench
    app.kubernetes.io/name: app-%[1]d
data:
  tenant: "%[1]d"
  settings.yaml: |
    replicas: 2
    name: app-%[1]d
---
# Source: tenants/templates/secret.yaml
apiVersion: v1
kind: Secret
metadata:
  name: sec-%[1]d
  labels:
    app.kubernetes.io/instance: bench
type: Opaque
stringData:
  token: not-a-secret-%[1]d
---
# Source: tenants/templates/serviceaccount.yaml
apiVersion: v1
kind: ServiceAccount
metadata:
  name: sa-%[1]d
  labels:
    app.kubernetes.io/instance: bench
---
# Source: tenants/templates/deployment.yaml
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app-%[1]d
  labels:
    app.kubernetes.io/instance: bench
    app.kubernetes.io/name: app-%[1]d
spec:
  replicas: 2
  selector:
    matchLabels:
      app.kubernetes.io/instance: bench
      app.kubernetes.io/name: app-%[1]d
  template:
    metadata:
      labels:
        app.kubernetes.io/instance: bench
        app.kubernetes.io/name: app-%[1]d
    spec:
      serviceAccountName: sa-%[1]d
      containers:
      - name: web
        image: nginx:1.25
        ports:
        - containerPort: 8080
        envFrom:
        - configMapRef:
            name: cfg-%[1]d
        env:
        - name: TOKEN
          valueFrom:
            secretKeyRef:
              name: sec-%[1]d
              key: token
---
# Source: tenants/templates/service.yaml
apiVersion: v1
kind: Service
metadata:
  name: app-%[1]d
  labels:
    app.kubernetes.io/instance: bench
    app.kubernetes.io/component: web
spec:
  selector:
    app.kubernetes.io/instance: bench
    app.kubernetes.io/name: app-%[1]d
  ports:
  - port: 80
    targetPort: 8080
`, i)
	}
	return b.Bytes()
}
