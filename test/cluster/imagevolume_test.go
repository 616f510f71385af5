package cluster

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/test/kubeenv"
)

// imageVolumeDeployment runs the v1 web server with the v2 image as an
// image volume (ImageVolume, GA and on by default since Kubernetes 1.36):
// its /etc/web-version comes from the volume through a subPath, so the
// server answers "v2"; the whole image is at /content too.
const imageVolumeDeployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: imagevol, namespace: e2e}
spec:
  replicas: 1
  selector:
    matchLabels: {app: imagevol}
  template:
    metadata:
      labels: {app: imagevol}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: web
        image: IMAGE
        command: ["/bin/web", "serve", ":8080"]
        readinessProbe:
          httpGet: {path: /, port: 8080}
          periodSeconds: 1
        volumeMounts:
        - {name: content, mountPath: /etc/web-version, subPath: etc/web-version, readOnly: true}
        - {name: content, mountPath: /content, readOnly: true}
      volumes:
      - name: content
        image: {reference: VOLUME, pullPolicy: IfNotPresent}
`

// imageVolume: a Deployment whose pod mounts an OCI image as a volume
// serves the files of that image, read-only.
func (e *env) imageVolume(t *testing.T) {
	e.apply(t, strings.ReplaceAll(imageVolumeDeployment, "VOLUME", e.imageV2))
	e.kubectl(t, "rollout", "status", "-n", ns, "deployment/imagevol", "--timeout", startTimeout.String())
	pods := e.pods(t, ns, "app=imagevol")
	if len(pods) != 1 {
		t.Fatalf("%d pods of app=imagevol, want 1", len(pods))
	}
	p := pods[0]
	body, err := kubeenv.Get(fmt.Sprintf("http://%s/", net.JoinHostPort(p.Status.PodIP, "8080")))
	if want := "v2 " + p.Name + "\n"; err != nil || body != want {
		t.Errorf("GET %s:8080 (%s): %q %v, want %q: the version from the image volume", p.Status.PodIP, p.Name, body, err, want)
	}
	if out := e.kubectl(t, "exec", "-n", ns, p.Name, "--", "cat", "/content/etc/web-version"); out != "v2\n" {
		t.Errorf("/content/etc/web-version in the pod: %q, want the v2 image's", out)
	}
	out, err := e.kubectlErr("exec", "-n", ns, p.Name, "--", "touch", "/content/new")
	if err == nil || !strings.Contains(out+err.Error(), "Read-only file system") {
		t.Errorf("touch in the image volume: %q %v, want EROFS", out, err)
	}
	e.kubectl(t, "delete", "-n", ns, "deployment/imagevol", "--wait=true")
}
