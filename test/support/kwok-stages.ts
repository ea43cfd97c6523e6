// kwok stage configuration for the fake nodes of the control-plane tests. Nodes become Ready
// and stay so (kwok renews their leases); pods bound to a fake node go Running and stay
// Running until a test chooses how they end by annotating them with an exit code.
//
// Templates are Go text/template (with sprig) rendered by kwok against the object; each
// result is a strategic-merge patch of the status, so lists merge by key (conditions by type,
// containerStatuses by name) and `null` removes a field.
import { stringify } from 'yaml';

/** Annotation that completes a running pod on a fake node: "0" Succeeded, else Failed. */
export const kwokExitCodeAnnotation = 'moerl.dev/kwok-exit-code';
/** Optional: the terminated reason to report (default Completed for 0, Error otherwise). */
export const kwokExitReasonAnnotation = 'moerl.dev/kwok-exit-reason';
/** Annotation kwok is told to manage nodes by (--manage-nodes-with-annotation-selector). */
export const kwokNodeAnnotation = { key: 'kwok.x-k8s.io/node', value: 'fake' };

// Exit codes a container can report. Matching only these keeps a malformed annotation from
// turning into exit code 0 (sprig's atoi yields 0 for anything that is not a number): such a
// pod simply stays Running.
const exitCodes = Array.from({ length: 256 }, (_, code) => String(code));

const notDeleted = { key: '.metadata.deletionTimestamp', operator: 'DoesNotExist' };

function stage(name: string, kind: 'Node' | 'Pod', spec: Record<string, unknown>): unknown {
  return {
    apiVersion: 'kwok.x-k8s.io/v1alpha1',
    kind: 'Stage',
    metadata: { name },
    spec: { resourceRef: { apiGroup: 'v1', kind }, ...spec },
  };
}

function statusPatch(template: string): { patches: unknown[] } {
  return { patches: [{ subresource: 'status', root: 'status', type: 'strategic', template }] };
}

const nodeConditions = `
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}`;

// A node created without resources gets room for plenty of pods.
const nodeReady = stage('moerl-node-ready', 'Node', {
  selector: {
    matchExpressions: [
      {
        key: '.status.conditions.[] | select( .type == "Ready" ) | .status',
        operator: 'NotIn',
        values: ['True'],
      },
    ],
  },
  next: statusPatch(`{{ $now := Now }}${nodeConditions}
{{ if not .status.allocatable }}
allocatable: { cpu: "64", memory: 512Gi, pods: "250" }
capacity: { cpu: "64", memory: 512Gi, pods: "250" }
{{ end }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
  kernelVersion: {{ printf "kwok-%s" Version | Quote }}
phase: Running
`),
});

// The lease kwok renews keeps a node Ready; this refreshes the conditions as a kubelet does
// every five minutes.
const nodeHeartbeat = stage('moerl-node-heartbeat', 'Node', {
  selector: {
    matchExpressions: [
      {
        key: '.status.conditions.[] | select( .type == "Ready" ) | .status',
        operator: 'In',
        values: ['True'],
      },
    ],
  },
  delay: { durationMilliseconds: 300_000, jitterDurationMilliseconds: 310_000 },
  next: statusPatch(`{{ $now := Now }}${nodeConditions}`),
});

const podRunning = stage('moerl-pod-running', 'Pod', {
  selector: {
    matchExpressions: [notDeleted, { key: '.status.phase', operator: 'In', values: ['Pending'] }],
  },
  next: statusPatch(`{{ $now := Now }}
conditions:
- { type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }} }
- { type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }} }
- { type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }} }
{{ range .spec.readinessGates }}
- { type: {{ .conditionType | Quote }}, status: "True", lastTransitionTime: {{ $now | Quote }} }
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  restartCount: 0
  {{ if eq (or .restartPolicy "") "Always" }}
  ready: true
  started: true
  state: { running: { startedAt: {{ $now | Quote }} } }
  {{ else }}
  ready: true
  state: { terminated: { exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }} } }
  {{ end }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state: { running: { startedAt: {{ $now | Quote }} } }
{{ end }}
{{ with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
hostIPs: [ { ip: {{ . | Quote }} } ]
{{ end }}
{{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ . | Quote }}
podIPs: [ { ip: {{ . | Quote }} } ]
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
`),
});

// Every container terminates with the chosen code, whatever the restartPolicy: a test
// decides how the pod ends, not how often it restarts.
const podExit = stage('moerl-pod-exit', 'Pod', {
  selector: {
    matchExpressions: [
      notDeleted,
      { key: '.status.phase', operator: 'In', values: ['Running'] },
      { key: `.metadata.annotations["${kwokExitCodeAnnotation}"]`, operator: 'In', values: exitCodes },
    ],
  },
  next: statusPatch(`{{ $now := Now }}
{{ $code := index .metadata.annotations "${kwokExitCodeAnnotation}" | atoi }}
{{ $reason := index .metadata.annotations "${kwokExitReasonAnnotation}" | default (ternary "Completed" "Error" (eq $code 0)) }}
{{ $podReason := ternary "PodCompleted" "PodFailed" (eq $code 0) }}
conditions:
- { type: ContainersReady, status: "False", reason: {{ $podReason }}, lastTransitionTime: {{ $now | Quote }} }
- { type: Ready, status: "False", reason: {{ $podReason }}, lastTransitionTime: {{ $now | Quote }} }
containerStatuses:
{{ range .status.containerStatuses }}
- name: {{ .name | Quote }}
  ready: false
  started: false
  state:
    running: null
    terminated:
      exitCode: {{ $code }}
      reason: {{ $reason | Quote }}
      startedAt: {{ with .state.running }}{{ .startedAt | Quote }}{{ else }}{{ $now | Quote }}{{ end }}
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: {{ ternary "Succeeded" "Failed" (eq $code 0) }}
`),
});

// A kubelet removes a deleted pod once its containers are gone; kwok has none to stop.
const podDelete = stage('moerl-pod-delete', 'Pod', {
  selector: { matchExpressions: [{ key: '.metadata.deletionTimestamp', operator: 'Exists' }] },
  next: { delete: true },
});

/** The stage configuration file kwok reads with --config. */
export function kwokStagesYaml(): string {
  return [nodeReady, nodeHeartbeat, podRunning, podExit, podDelete]
    .map((doc) => stringify(doc, { lineWidth: 0 }))
    .join('---\n');
}
