package kubelet

// The static pods of the tier. IMAGE becomes the test image (busybox on
// the loopback registry), HOSTPORT a free port of the host.

// webPod (scenario 1): a logger writing to stdout and stderr every second,
// and an httpd on 8080 of the pod's address.
const webPod = `apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: e2e
  labels: {app: web}
  annotations: {berth.test/note: "kept as is"}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: logger
    image: IMAGE
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "i=0; while true; do echo \"tick $i\"; echo \"tock $i\" >&2; i=$((i+1)); sleep 1; done"]
  - name: httpd
    image: IMAGE
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www && echo hello from berth > /www/index.html && exec httpd -f -p 8080 -h /www"]
    ports: [{containerPort: 8080}]
`

// probesPod (scenario 2): "healthy" passes an exec liveness and an HTTP
// readiness probe; "flaky" fails its exec liveness probe 4 s after each start,
// so the kubelet restarts it; "unready" never passes its readiness probe.
const probesPod = `apiVersion: v1
kind: Pod
metadata:
  name: probes
  namespace: e2e
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: healthy
    image: IMAGE
    command: ["sh", "-c", "touch /tmp/healthy && mkdir -p /www && echo ready > /www/ready && exec httpd -f -p 8080 -h /www"]
    livenessProbe:
      exec: {command: ["test", "-f", "/tmp/healthy"]}
      periodSeconds: 2
      failureThreshold: 2
    readinessProbe:
      httpGet: {path: /ready, port: 8080}
      periodSeconds: 1
  - name: flaky
    image: IMAGE
    command: ["sh", "-c", "touch /tmp/alive; sleep 4; rm /tmp/alive; exec sleep 3600"]
    livenessProbe:
      exec: {command: ["test", "-f", "/tmp/alive"]}
      periodSeconds: 1
      failureThreshold: 2
  - name: unready
    image: IMAGE
    command: ["sleep", "3600"]
    readinessProbe:
      httpGet: {path: /, port: 9999}
      periodSeconds: 1
`

// crashPod (scenario 3): a container that exits 3 at once, restartPolicy Always.
const crashPod = `apiVersion: v1
kind: Pod
metadata:
  name: crash
  namespace: e2e
spec:
  containers:
  - name: crasher
    image: IMAGE
    command: ["sh", "-c", "echo crashing with 3; exit 3"]
`

// initPod (scenario 6): an init container fills an emptyDir the main container reads.
const initPod = `apiVersion: v1
kind: Pod
metadata:
  name: init
  namespace: e2e
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: prepare
    image: IMAGE
    command: ["sh", "-c", "echo prepared-by-init > /data/msg"]
    volumeMounts: [{name: data, mountPath: /data}]
  containers:
  - name: main
    image: IMAGE
    command: ["sh", "-c", "cat /data/msg; exec sleep 3600"]
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - name: data
    emptyDir: {}
`

// seccompPod (scenario 6): one container under the runtime's default
// seccomp profile, one with none (the kubelet's default without
// seccompDefault).
const seccompPod = `apiVersion: v1
kind: Pod
metadata:
  name: seccomp
  namespace: e2e
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: confined
    image: IMAGE
    command: ["sleep", "3600"]
    securityContext:
      seccompProfile: {type: RuntimeDefault}
  - name: plain
    image: IMAGE
    command: ["sleep", "3600"]
`

// usernsPod (scenario 6): a pod in its own user namespace (hostUsers: false).
const usernsPod = `apiVersion: v1
kind: Pod
metadata:
  name: userns
  namespace: e2e
spec:
  hostUsers: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: IMAGE
    command: ["sleep", "3600"]
`

// hostNetPod (scenario 6): an httpd in the host's network namespace, on loopback.
const hostNetPod = `apiVersion: v1
kind: Pod
metadata:
  name: hostnet
  namespace: e2e
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www && echo hello from the host network > /www/index.html && exec httpd -f -p 127.0.0.1:HOSTPORT -h /www"]
`

// limitsPod (scenario 6): a Burstable pod with requests and limits.
const limitsPod = `apiVersion: v1
kind: Pod
metadata:
  name: limits
  namespace: e2e
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: limited
    image: IMAGE
    command: ["sleep", "3600"]
    resources:
      requests: {cpu: 100m, memory: 32Mi}
      limits: {cpu: 250m, memory: 64Mi}
`

// guaranteedPod (scenario 6): limits only, so requests equal them: Guaranteed,
// and an oom_score_adj of -997 that a host without CAP_SYS_RESOURCE cannot grant.
const guaranteedPod = `apiVersion: v1
kind: Pod
metadata:
  name: guaranteed
  namespace: e2e
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: fixed
    image: IMAGE
    command: ["sleep", "3600"]
    resources:
      limits: {cpu: 200m, memory: 48Mi}
`
